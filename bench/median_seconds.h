#pragma once
// The timing rule the benchmarks share: one warm-up run, then the median of `repeats` timed runs
// (the median, so one run disturbed by another process does not move the figure).

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
