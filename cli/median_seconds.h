#pragma once
// The timing rule the benchmarks (bench/ and `torchbridge bench`) share: one warm-up run, then the
// median of `repeats` timed runs (the median, so one run disturbed by another process does not
// move the figure).

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

inline double median_seconds(int repeats, const std::function<void()>& body) {
  body();  // warm-up
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    body();
    samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Runs torch's CPU kernels on `count` intra-op threads while it lives, and restores the count
// after. Most benchmarks take one: on a small shared machine, OpenMP's spinning threads make
// multi-threaded timings swing widely whenever another process takes a core. Both sides of a
// comparison run under it.
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int count) : previous_(at::get_num_threads()) { at::set_num_threads(count); }
  ~IntraOpThreads() { at::set_num_threads(previous_); }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int previous_;
};

class OneIntraOpThread : public IntraOpThreads {
 public:
  OneIntraOpThread() : IntraOpThreads(1) {}
};
