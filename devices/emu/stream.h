// An emulated stream: one worker thread draining a FIFO of operations, so work queued on a stream
// runs in order and asynchronously to the thread that queued it, as on a real device.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace torchbridge::emu {

class Stream {
 public:
  // Starts the worker (std::system_error if the thread cannot be created). Every operation sleeps
  // `latency` on the worker before it runs, emulating launch and transfer latency.
  Stream(int device, int priority, std::chrono::microseconds latency);
  ~Stream();  // drains and joins, if shut_down() has not already
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int device() const { return device_; }
  // Recorded because the interface passes it; the emulator has one worker per stream and no
  // shared execution resource to arbitrate, so priority does not affect scheduling.
  int priority() const { return priority_; }

  // Appends an operation. False once the stream is shutting down (the operation is dropped).
  bool enqueue(std::function<void()> operation);

  // True when nothing is queued or running.
  bool idle() const;

  // Blocks until everything queued before the call has run. Work queued by other threads meanwhile
  // is not waited for, so a stream that is fed continuously cannot starve the caller.
  void synchronize();

  // Refuses new work, runs what is queued, then joins the worker. Call at most once.
  void shut_down();

 private:
  void run_worker();

  const int device_;
  const int priority_;
  const std::chrono::microseconds latency_;

  mutable std::mutex mutex_;
  std::condition_variable work_available_;
  std::condition_variable drained_;
  std::deque<std::function<void()>> queue_;
  // Operations are numbered as queued; the stream is idle when every numbered one has finished.
  std::uint64_t queued_ = 0;
  std::uint64_t finished_ = 0;
  bool stopping_ = false;
  std::thread worker_;  // last member: it starts running in the constructor and uses the others
};

}  // namespace torchbridge::emu
