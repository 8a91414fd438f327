// `torchbridge validate`: does a model compute the same thing on each backend as on the CPU in
// float64? Exit 0 only when every check passes.
#include "arguments.h"
#include "commands.h"
#include "isolated_validation.h"
#include "model_argument.h"
#include "text_format.h"

#include <torchbridge/optimize/compiled_model.h>
#include <torchbridge/parse_integer.h>
#include <torchbridge/registry.h>
#include <torchbridge/validation/builtin_models.h>
#include <torchbridge/validation/validator.h>

#include <c10/util/Exception.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::cli {
namespace {

constexpr const char* kHelp = R"(usage: torchbridge validate --model builtin:NAME|FILE [--backends LIST] [--dtype PRECISION]
                            [--input-shape SHAPE] [--seed N] [--checkpointing] [--isolate]
                            [--compiled PACKAGE] [--json]

Runs the model's forward and backward on the CPU in float64 (the reference) and on each backend,
and checks outputs and gradients against the reference, NaN/Inf, determinism, a save-and-reload
round trip, and that device memory returns to its baseline. Exit 0 only when every check passes.

  --model       builtin:mlp, builtin:cnn, builtin:transformer, or a TorchScript file
  --backends    comma-separated backend names (default: cpu and the best available backend);
                naming an SDK device such as emu loads it
  --dtype       precision on the backends: fp32 (default), bf16, fp16, fp64 (or torch's names:
                float32, bfloat16, float16, float64), or fp8 (weights rounded to float8_e4m3fn,
                computing in bf16)
  --input-shape e.g. 4,16,32 (several inputs: 4,16,32;4,16); required for a file, optional for
                built-in models (default: the model's own)
  --seed        seed of the generated inputs (default 0)
  --checkpointing  train through activation checkpointing everywhere, the reference included:
                each forward pass with gradients runs as one checkpointed region, so the
                gradients compared come from the recomputed backward
  --isolate     validate every backend but the CPU in a child process of its own, so one that
                crashes is reported as a failed check instead of ending the run. SDK devices are
                always validated in a child process when the list also names a native
                accelerator such as cuda: PyTorch's autograd serves one accelerator per process.
  --compiled    an AOTInductor package (.pt2) compiled from the model (torchbridge export
                --format aoti, or torch._inductor.aoti_compile_and_package): also run it, on the
                device it was compiled for, and check its outputs against the reference under
                the fp32 bound (backend "compiled" in the report; fp32 only)
  --json        the full report as JSON (every measured value), no progress display
)";

std::string shapes_text(const std::vector<std::vector<int64_t>>& shapes) {
  std::string text;
  for (const auto& shape : shapes) {
    if (!text.empty()) text += ";";
    for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  }
  return text;
}

std::vector<std::string> default_backends() {
  const std::string best = detect_best_backend();
  return best == "cpu" ? std::vector<std::string>{"cpu"} : std::vector<std::string>{"cpu", best};
}

// One line per backend and kind of check: how many passed and the worst values measured.
// The worse of two metrics by `worse_than`, where NaN (a result or reference that was not a
// number) is the worst of all: std::max and std::min keep the first argument against NaN, so the
// table showed "0.00e+00" beside a check whose JSON said null.
template <typename WorseThan>
double worst(double so_far, double value, WorseThan worse_than) {
  if (std::isnan(so_far) || std::isnan(value)) return std::numeric_limits<double>::quiet_NaN();
  return worse_than(value, so_far) ? value : so_far;
}

// The --backends list with each backend once: split_list compares the names as written, so an
// alias and its name ("emu,privateuse1") validated one device twice. A name no backend has is
// kept as written for the validator to refuse.
std::vector<std::string> distinct_backends(const std::string& text) {
  std::vector<std::string> names = split_list(text, "--backends");
  std::map<std::string, std::string> written_as;  // backend name -> the entry that named it
  for (const std::string& name : names) {
    std::string backend = name;
    try {
      backend = BackendRegistry::instance().lookup(name)->name();
    } catch (const c10::Error&) {
      continue;
    }
    const auto [first, fresh] = written_as.emplace(backend, name);
    if (!fresh) {
      throw UsageError("--backends '" + text + "' names backend '" + backend + "' twice ('" + first->second +
                       "' and '" + name + "')");
    }
  }
  return names;
}

void print_table(const validation::ValidationReport& report, const std::string& label) {
  // Wide enough for every backend name ("privateus" was cut from privateuse1).
  size_t backend_width = 10;
  for (const auto& c : report.checks) backend_width = std::max(backend_width, c.backend.size() + 2);
  std::cout << "Validated " << label << " (" << report.model_kind << ") in " << name_of(report.precision)
            << (report.checkpointing ? " with checkpointed training" : "") << " against " << report.reference << "\n\n";
  std::cout << column("backend", backend_width) << column("check", 13) << column("passed", 9)
            << column("max abs err", 13) << column("max rel err", 13) << column("min cosine", 12) << "\n";
  struct Row {
    int passed = 0, total = 0;
    double abs = 0, rel = 0, cosine = 1;
    bool has_metrics = false;
  };
  std::vector<std::pair<std::string, validation::CheckKind>> order;
  std::map<std::pair<std::string, validation::CheckKind>, Row> rows;
  for (const auto& c : report.checks) {
    const auto key = std::make_pair(c.backend, c.check);
    if (!rows.count(key)) order.push_back(key);
    Row& row = rows[key];
    row.total++;
    row.passed += c.passed ? 1 : 0;
    if (c.metrics) {
      row.has_metrics = true;
      row.abs = worst(row.abs, c.metrics->max_abs_error, std::greater<>());
      row.rel = worst(row.rel, c.metrics->max_rel_error, std::greater<>());
      row.cosine = worst(row.cosine, c.metrics->cosine_similarity, std::less<>());
    }
  }
  for (const auto& key : order) {
    const Row& row = rows[key];
    const bool comparison = key.second == validation::CheckKind::kOutput || key.second == validation::CheckKind::kGradient;
    std::cout << column(key.first, backend_width) << column(validation::check_name(key.second), 13)
              << column(std::to_string(row.passed) + "/" + std::to_string(row.total), 9)
              << column(row.has_metrics ? scientific(row.abs) : "-", 13)
              << column(comparison ? scientific(row.rel) : "-", 13)
              << column(comparison ? std::to_string(row.cosine).substr(0, 10) : "-", 12) << "\n";
  }
  bool any_failure = false;
  for (const auto& c : report.checks) {
    if (c.passed) continue;
    if (!any_failure) std::cout << "\nFailures:\n";
    any_failure = true;
    std::cout << "  " << c.backend << " " << validation::check_name(c.check) << " " << c.subject << ": " << c.detail << "\n";
  }
  if (!report.not_checked.empty()) std::cout << "\nNot checked:\n";
  for (const auto& line : report.not_checked) std::cout << "  " << line << "\n";
  std::cout << "\nTime: reference " << scientific(report.reference_seconds) << " s";
  for (const auto& t : report.timings) std::cout << ", " << t.backend << " " << scientific(t.seconds) << " s";
  std::cout << "\nResult: " << report.passed() << "/" << report.total_tests() << " checks passed — "
            << (report.is_valid() ? "VALID" : "NOT VALID") << "\n";
}

}  // namespace

int run_validate(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments(
      "validate", args, {{"--json", "--isolate", "--checkpointing"},
                                {"--model", "--backends", "--dtype", "--input-shape", "--seed", "--compiled"}, false});
  if (parsed.has("--help")) {
    std::cout << kHelp;
    return 0;
  }
  const std::string* model_spec = parsed.option("--model");
  if (!model_spec) throw UsageError("validate needs --model builtin:NAME or --model FILE (see --help)");
  validation::ValidatorOptions options;
  options.backends = parsed.option("--backends") ? distinct_backends(*parsed.option("--backends")) : default_backends();
  if (const auto* dtype = parsed.option("--dtype")) options.precision = validation::validation_precision(*dtype);
  if (const auto* seed = parsed.option("--seed")) options.seed = parse_unsigned(*seed, "--seed");
  options.checkpointing = parsed.has("--checkpointing");
  const ModelArgument model = load_model_argument(*model_spec);
  const auto shapes = input_shapes_for(model, parsed.option("--input-shape"), "validation");
  // Loaded before any validation, so a wrong file or dtype gives no report.
  std::optional<CompiledModel> compiled;
  if (const auto* package = parsed.option("--compiled")) {
    if (options.precision != Precision::kFp32) {
      throw UsageError("--compiled checks the package in fp32 (it computes in the dtype it was compiled for); "
                       "leave out --dtype " + std::string(name_of(options.precision)));
    }
    compiled.emplace(*package);
  }
  const bool json = parsed.has("--json");
  const bool show_progress = !json && isatty(STDERR_FILENO) != 0;
  if (show_progress) {
    options.progress = [](const std::string& backend, const std::string& step, int done, int total) {
      if (step == "done") {
        std::cerr << "\r\033[K" << std::flush;  // clear the line before the report
        return;
      }
      std::cerr << "\r\033[K[" << done + 1 << "/" << total << "] " << backend << ": " << step << std::flush;
    };
  }
  // Backends that run in a child process each; the rest run here. Every backend name is resolved
  // first (the precision was checked when parsed), so bad input gives no report.
  const auto isolated = backends_for_child_processes(options.backends, parsed.has("--isolate"));
  for (const auto& name : isolated) {
    // An SDK device says whether it is available only by loading, which is the child's job.
    if (BackendRegistry::instance().device_type_of(name) != c10::DeviceType::PrivateUse1) create_backend(name);
  }
  validation::ValidatorOptions here = options;
  here.backends.clear();
  for (const auto& name : options.backends) {
    if (std::find(isolated.begin(), isolated.end(), name) == isolated.end()) here.backends.push_back(name);
  }
  std::vector<validation::ValidationReport> parts;
  if (!here.backends.empty()) {
    const validation::Validator validator(here);
    const auto source = validation::model_from(model.module);
    parts.push_back(validator.validate(*source, shapes));
  }
  std::vector<std::string> child_args = {"--model", *model_spec, "--dtype", name_of(options.precision), "--input-shape",
                                         shapes_text(shapes), "--seed", std::to_string(options.seed)};
  if (options.checkpointing) child_args.push_back("--checkpointing");
  for (const auto& name : isolated) {
    if (show_progress) std::cerr << "\r\033[K" << name << ": validating in a child process" << std::flush;
    parts.push_back(validate_in_child(name, child_args, options.precision));
  }
  if (show_progress) std::cerr << "\r\033[K" << std::flush;
  validation::ValidationReport report = merge_reports(parts, options.backends);
  if (compiled) {
    if (show_progress) std::cerr << "\r\033[Kcompiled: running the package" << std::flush;
    const auto start = std::chrono::steady_clock::now();
    const auto source = validation::model_from(model.module);
    const auto run = [&](const std::vector<at::Tensor>& inputs) { return compiled->run(inputs); };
    for (auto& check : validation::check_compiled(*source, shapes, options.seed, "compiled", compiled->device(), run)) {
      report.checks.push_back(std::move(check));
    }
    report.backends.push_back("compiled");
    report.timings.push_back(
        {"compiled", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
    if (show_progress) std::cerr << "\r\033[K" << std::flush;
  }
  if (json) {
    std::cout << validation::report_json(report) << "\n";
  } else {
    print_table(report, model.label);
  }
  return report.is_valid() ? 0 : 1;
}

}  // namespace torchbridge::cli
