// `torchbridge bench`: the SDK, checkpoint and validation micro-benchmarks in one run, one table of
// ratios against baselines measured in the same run.
#include "arguments.h"
#include "bench_cases.h"
#include "commands.h"
#include "printable_json.h"
#include "text_format.h"

#include <torchbridge/registry.h>

#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace torchbridge::cli {
namespace {

constexpr const char* kHelp = R"(usage: torchbridge bench [--backends LIST] [--groups LIST] [--quick] [--json]

Runs the micro-benchmarks and prints one table: every figure next to a baseline measured in the
same run, their ratio, and the design's goal where it sets one. A progress line per case goes to
stderr. Exit 0 when every case ran (a benchmark reports; goals not met are shown, not failed).

  --backends  comma-separated backends (default: cpu and the best available accelerator, or cpu
              and emu where there is none); naming an SDK device such as emu loads it
  --groups    which groups, comma-separated (default: all):
                sdk         per non-CPU backend: add on 1..1000 elements and a matmul against
                            the CPU, host<->device copies against memcpy (goals for SDK devices:
                            <= 3x, <= 1.2x, >= 0.8x)
                checkpoint  save against write()+fsync of the same bytes; load onto each backend
                            against read() of as many bytes into new tensors
                validation  the validator on all the backends against one forward+backward on
                            each (goal <= 3x)
  --quick     fewer repetitions and smaller sizes (a smoke run; figures are noisier)
  --json      the results as JSON (docs/cli-json.md)

The same cases run alone as build/bin/sdk_benchmark and build/bin/validation_benchmark.
)";

const std::set<std::string> kGroups = {"sdk", "checkpoint", "validation"};

std::vector<std::string> default_bench_backends() {
  const std::string best = detect_best_backend();
  return {"cpu", best == "cpu" ? "emu" : best};
}

std::string value_text(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), value >= 100 ? "%.1f" : "%.3g", value);
  return text;
}

}  // namespace

bool BenchResult::met() const {
  if (!goal) return true;
  return higher_is_better ? ratio() >= *goal : ratio() <= *goal;
}

void print_bench_table(const std::vector<BenchResult>& results) {
  std::cout << column("group", 11) << column("backend", 9) << column("case", 36) << column("baseline", 31)
            << column("measured", 13) << column("ratio", 8) << "goal\n";
  int not_met = 0;
  for (const auto& r : results) {
    std::string goal = "-";
    if (r.goal) {
      goal = std::string(r.higher_is_better ? ">= " : "<= ") + value_text(*r.goal) + "x  " + (r.met() ? "met" : "NOT met");
      not_met += r.met() ? 0 : 1;
    }
    std::cout << column(r.group, 11) << column(r.backend, 9) << column(r.name, 36)
              << column(value_text(r.baseline) + " " + r.unit + " " + r.baseline_label, 31)
              << column(value_text(r.measured) + " " + r.unit, 13) << column(fixed(r.ratio(), 2) + "x", 8) << goal
              << (r.note.empty() ? "" : "  (" + r.note + ")") << "\n";
  }
  std::cout << "\n" << results.size() << " cases, " << not_met << " goal(s) not met; times are medians, lower is "
            << "better; GB/s higher is better\n";
}

std::string bench_json(const std::vector<BenchResult>& results) {
  nlohmann::json items = nlohmann::json::array();
  for (const auto& r : results) {
    items.push_back({{"group", r.group},
                     {"backend", r.backend},
                     {"case", r.name},
                     {"unit", r.unit},
                     {"baseline_label", r.baseline_label},
                     {"baseline", r.baseline},
                     {"measured", r.measured},
                     {"ratio", r.ratio()},
                     {"higher_is_better", r.higher_is_better},
                     {"goal", r.goal ? nlohmann::json(*r.goal) : nlohmann::json(nullptr)},
                     {"met", r.goal ? nlohmann::json(r.met()) : nlohmann::json(nullptr)},
                     {"note", r.note}});
  }
  return printable_json(nlohmann::json{{"schema", "torchbridge.bench/1"}, {"torch", TORCH_VERSION}, {"results", items}});
}

int run_bench(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments("bench", args, {{"--quick", "--json"}, {"--backends", "--groups"}, false});
  if (parsed.has("--help")) {
    std::cout << kHelp;
    return 0;
  }
  const std::vector<std::string> backends =
      parsed.option("--backends") ? split_list(*parsed.option("--backends"), "--backends") : default_bench_backends();
  std::vector<std::string> groups = {"sdk", "checkpoint", "validation"};
  if (const auto* list = parsed.option("--groups")) {
    groups = split_list(*list, "--groups");
    for (const auto& group : groups) {
      if (!kGroups.count(group)) throw UsageError("--groups: '" + group + "' is not one of sdk, checkpoint, validation");
    }
  }
  for (const auto& name : backends) create_backend(name);  // unknown or unavailable: an error before any work
  const auto wanted = [&](const std::string& group) {
    return std::find(groups.begin(), groups.end(), group) != groups.end();
  };
  const auto start = std::chrono::steady_clock::now();
  BenchOptions options;
  options.quick = parsed.has("--quick");
  options.progress = [&](const std::string& label) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cerr << "[" << fixed(elapsed, 1) << " s] " << label << std::endl;
  };
  std::vector<BenchResult> results;
  const auto append = [&](std::vector<BenchResult> more) { results.insert(results.end(), more.begin(), more.end()); };
  if (wanted("sdk")) {
    bool any_device = false;
    for (const auto& name : backends) {
      if (create_backend(name)->device_type() == c10::kCPU) continue;
      any_device = true;
      append(bench_sdk(name, options));
    }
    if (!any_device) std::cerr << "sdk: skipped, --backends names no device besides the CPU\n";
  }
  if (wanted("checkpoint")) {
    append(bench_checkpoint(backends, options));
  }
  if (wanted("validation")) append(bench_validation(backends, options));
  if (parsed.has("--json")) {
    std::cout << bench_json(results) << "\n";
  } else {
    print_bench_table(results);
  }
  return 0;
}

}  // namespace torchbridge::cli
