// An emulated event. Each event_record starts a new *generation*: the event is complete when the
// worker of the recording stream reaches the marker of its latest generation. Generations let a
// re-record reset the event while a stream_wait_event issued earlier keeps waiting for the record
// it saw, not for a later one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

namespace torchbridge::emu {

class Stream;

class Event : public std::enable_shared_from_this<Event> {
 public:
  using Clock = std::chrono::steady_clock;

  Event(int device, bool timing_enabled) : device_(device), timing_enabled_(timing_enabled) {}

  int device() const { return device_; }
  bool timing_enabled() const { return timing_enabled_; }

  // Queues a marker for a new generation on `stream`. False if the stream refused it (shutting
  // down); the event is then left as it was.
  bool record_on(Stream& stream);

  // The generation of the latest record, 0 if never recorded.
  std::uint64_t latest_generation() const;

  enum class State { never_recorded, pending, complete };
  State state() const;

  // Blocks until `generation`'s marker has been reached (immediately for generation 0).
  void wait_for(std::uint64_t generation) const;

  // When the worker reached the latest record; nullopt unless that record is complete and the
  // event was created with timing enabled.
  std::optional<Clock::time_point> completion_time() const;

 private:
  void reach(std::uint64_t generation);  // runs on the recording stream's worker

  const int device_;
  const bool timing_enabled_;

  mutable std::mutex mutex_;
  mutable std::condition_variable reached_;
  std::uint64_t latest_ = 0;
  std::set<std::uint64_t> pending_;  // recorded generations whose marker has not been reached
  std::optional<Clock::time_point> completed_at_;
};

}  // namespace torchbridge::emu
