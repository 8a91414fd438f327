#include "event.h"

#include "stream.h"

namespace torchbridge::emu {

bool Event::record_on(Stream& stream) {
  // Holding the lock across enqueue keeps the new generation invisible until the marker is really
  // queued; the worker takes this lock only in reach(), never while it holds the stream's lock.
  std::lock_guard lock(mutex_);
  const std::uint64_t generation = latest_ + 1;
  if (!stream.enqueue([self = shared_from_this(), generation] { self->reach(generation); })) return false;
  latest_ = generation;
  pending_.insert(generation);
  completed_at_.reset();
  return true;
}

std::uint64_t Event::latest_generation() const {
  std::lock_guard lock(mutex_);
  return latest_;
}

Event::State Event::state() const {
  std::lock_guard lock(mutex_);
  if (latest_ == 0) return State::never_recorded;
  return pending_.contains(latest_) ? State::pending : State::complete;
}

void Event::wait_for(std::uint64_t generation) const {
  std::unique_lock lock(mutex_);
  reached_.wait(lock, [&] { return !pending_.contains(generation); });
}

std::optional<Event::Clock::time_point> Event::completion_time() const {
  std::lock_guard lock(mutex_);
  return completed_at_;
}

void Event::reach(std::uint64_t generation) {
  const Clock::time_point now = Clock::now();  // as close to "the worker got here" as possible
  {
    std::lock_guard lock(mutex_);
    pending_.erase(generation);
    // Only the latest record defines the event's time; an older marker on another stream that is
    // reached late must not overwrite it.
    if (generation == latest_ && timing_enabled_) completed_at_ = now;
  }
  reached_.notify_all();
}

}  // namespace torchbridge::emu
