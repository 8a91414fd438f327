#include "stream.h"

#include <utility>

namespace torchbridge::emu {

Stream::Stream(int device, int priority, std::chrono::microseconds latency)
    : device_(device), priority_(priority), latency_(latency), worker_([this] { run_worker(); }) {}

Stream::~Stream() {
  if (worker_.joinable()) shut_down();
}

bool Stream::enqueue(std::function<void()> operation) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return false;
    queue_.push_back(std::move(operation));
    ++queued_;
  }
  work_available_.notify_one();
  return true;
}

bool Stream::idle() const {
  std::lock_guard lock(mutex_);
  return finished_ == queued_;
}

void Stream::synchronize() {
  std::unique_lock lock(mutex_);
  const std::uint64_t target = queued_;
  drained_.wait(lock, [&] { return finished_ >= target; });
}

void Stream::shut_down() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_available_.notify_one();
  worker_.join();  // the worker empties the queue before it returns
}

void Stream::run_worker() {
  for (;;) {
    std::function<void()> operation;
    {
      std::unique_lock lock(mutex_);
      work_available_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      operation = std::move(queue_.front());
      queue_.pop_front();
    }
    if (latency_.count() > 0) std::this_thread::sleep_for(latency_);
    operation();
    operation = nullptr;  // release what it captured (events, ...) before reporting it done
    {
      std::lock_guard lock(mutex_);
      ++finished_;
    }
    drained_.notify_all();
  }
}

}  // namespace torchbridge::emu
