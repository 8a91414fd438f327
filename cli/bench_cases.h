#pragma once
// The micro-benchmarks behind `torchbridge bench`, also run one group at a time by the programs in
// bench/ (sdk_benchmark, validation_benchmark). Every figure is a ratio to a baseline measured in
// the same run, on the same machine, so the ratio means something where the absolute time does not.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge::cli {

struct BenchResult {
  std::string group;           // "sdk", "checkpoint", "validation"
  std::string backend;         // what was measured on, e.g. "emu" or "cpu+emu"
  std::string name;            // e.g. "add, 100 elements"
  std::string unit;            // of baseline and measured: "us", "ms", "GB/s"
  std::string baseline_label;  // what the baseline is, e.g. "cpu eager", "memcpy"
  double baseline = 0;
  double measured = 0;
  bool higher_is_better = false;  // bandwidths; times are better lower
  std::optional<double> goal;     // the ratio the design asks for, where it asks for one
  std::string note;               // e.g. "report valid", "of it the float64 reference 1.2 ms"

  double ratio() const { return measured / baseline; }
  bool met() const;  // true without a goal
};

struct BenchOptions {
  bool quick = false;  // fewer repetitions, smaller sizes: a smoke run
  // Told each case before it runs, e.g. "sdk emu: add, 100 elements".
  std::function<void(const std::string& label)> progress;
};

// Small elementwise ops, a matmul, and pinned and pageable copies on `backend` against the same
// work on the CPU (copies against memcpy). The design's goals (<= 3x, <= 1.2x, >= 0.8x) are the
// SDK's: they apply to SDK devices such as emu, and a native accelerator's figures are shown
// without one. Runs torch's CPU kernels on one intra-op thread (both sides alike).
std::vector<BenchResult> bench_sdk(const std::string& backend, const BenchOptions& options);

// A safetensors checkpoint of float32 tensors saved (atomic write, fsync) against write() + fsync
// of the same bytes, and loaded onto each of `backends` through the C++ reader against read() of
// as many bytes into new CPU tensors.
std::vector<BenchResult> bench_checkpoint(const std::vector<std::string>& backends, const BenchOptions& options);

// The validator on `backends` (the built-in transformer, input `input_shape` or its own when
// empty) against one forward+backward pass on each of them, both on `intra_op_threads` CPU
// threads (one by default, as every group of `torchbridge bench`). Goal <= 3x.
std::vector<BenchResult> bench_validation(const std::vector<std::string>& backends, const BenchOptions& options,
                                          const std::vector<int64_t>& input_shape = {}, int intra_op_threads = 1);

// One table: group, backend, case, baseline, measured, ratio, goal, met.
void print_bench_table(const std::vector<BenchResult>& results);
// The same as JSON (docs/cli-json.md).
std::string bench_json(const std::vector<BenchResult>& results);

}  // namespace torchbridge::cli
