// `torchbridge portability`: the README's main job. Detects the hardware, trains the built-in
// transformer on the best backend, saves a portable training state, loads it on every other
// backend (the CPU and emu at least), validates that all compute the same thing, and reports.
//
// PyTorch serves one accelerator per process for autograd (include/torchbridge/one_accelerator.h):
// when the run trains on a native accelerator such as CUDA, the SDK devices are checked by this
// same command in a child process (`--check-checkpoint`), whose findings are merged here.
#include "arguments.h"
#include "child_process.h"
#include "commands.h"
#include "isolated_validation.h"
#include "portability_training.h"
#include "printable_json.h"
#include "temporary_directory.h"
#include "text_format.h"

#include <torchbridge/process_isolation.h>
#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/checkpoint/training_state.h>
#include <torchbridge/one_accelerator.h>
#include <torchbridge/parse_integer.h>
#include <torchbridge/registry.h>
#include <torchbridge/sdk/device.h>
#include <torchbridge/validation/builtin_models.h>
#include <torchbridge/precision.h>
#include <torchbridge/validation/validator.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace torchbridge::cli {
namespace {

constexpr const char* kHelp = R"(usage: torchbridge portability [--steps N] [--output DIR] [--checkpointing] [--isolate] [--json]

The portability run: detect the hardware, train the built-in transformer on the best available
backend, save a portable checkpoint (model, Adam state, RNG, counters) as safetensors, load it
on every other backend (available accelerators, the CPU, and the emulated device emu), check
that every copy computes the same outputs, and validate the model on all of them against the
CPU in float64. Exit 0 only when training reduced the loss and every check passed.

  --steps N     training steps, 20 or more (default 300)
  --output DIR  where the checkpoint goes, kept (default: a temporary directory under $TMPDIR or /tmp,
                removed when the run ends)
  --checkpointing  train through activation checkpointing (each step's forward pass is one
                checkpointed region, recomputed in backward), and validate the same way
  --isolate     check every backend other than the CPU and the training backend in a child
                process of its own. SDK devices are always checked in a child process when the
                run trains on a native accelerator such as cuda: PyTorch's autograd serves one
                accelerator per process.
  --json        the report as JSON

Used by the run itself to check backends in a child process:
  --check-checkpoint FILE --reference-outputs FILE --backends LIST [--checkpointing]
)";

constexpr const char* kSdkDevice = "emu";  // loadable on any machine

using Clock = std::chrono::steady_clock;
double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A measured difference. JSON has no NaN or infinity, so a load checked in a child process (a
// device whose outputs are NaN: what this run exists to catch) reports it as null; read it back
// as NaN, which fails every comparison, rather than stop the whole report on a type error.
double measured(const nlohmann::json& value) {
  return value.is_number() ? value.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

int parse_steps(const std::string* text) {
  // The loss must fall from the mean of the first 10 steps to the mean of the last 10: with fewer
  // than 20 steps the two windows overlap, and with 10 they are the same steps and it never can.
  return text ? static_cast<int>(parse_integer(*text, "--steps", 20, 100000)) : 300;
}

// --output DIR, made and proven writable before the training: a directory that cannot take the
// checkpoint must not cost the run it would hold (the save was the first write, after training).
std::string prepare_output_directory(const std::string& requested) {
  std::error_code error;
  std::filesystem::create_directories(requested, error);
  if (error) throw UsageError("--output '" + requested + "': cannot create the directory: " + error.message());
  std::string probe = requested + "/.torchbridge-write-probe-XXXXXX";
  const int descriptor = ::mkstemp(probe.data());
  if (descriptor < 0) {
    throw UsageError("--output '" + requested + "': cannot write in the directory: " + std::strerror(errno));
  }
  ::close(descriptor);
  ::unlink(probe.c_str());
  // The files the run writes there, checked too: a directory named transformer.safetensors failed
  // the run only after the whole training.
  for (const char* file : {"/transformer.safetensors", "/reference_outputs.safetensors"}) {
    check_output_file(requested + file, "--output");
  }
  return requested;
}

// One hardware line: available or why not, and the device names ("2 x name" when alike).
nlohmann::json describe_backend(const std::string& name, const Backend& backend) {
  const Availability availability = backend.availability();
  nlohmann::json item = {{"backend", name}, {"available", availability.available()}};
  if (!availability.available()) {
    item["reason"] = availability.reason;
    return item;
  }
  std::vector<std::pair<std::string, int>> devices;
  for (int i = 0; i < backend.device_count(); ++i) {
    const std::string device_name = backend.info(i).name;
    if (!devices.empty() && devices.back().first == device_name) {
      ++devices.back().second;
    } else {
      devices.emplace_back(device_name, 1);
    }
  }
  item["devices"] = nlohmann::json::array();
  for (const auto& [device_name, count] : devices) {
    item["devices"].push_back(count == 1 ? device_name : std::to_string(count) + " x " + device_name);
  }
  return item;
}

at::Tensor evaluation_batch() {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(12345);
  return at::randn(validation::builtin_model_info("transformer").input_shape, generator, at::TensorOptions());
}

at::Tensor outputs_on_cpu(torch::jit::Module& model, c10::Device device, const at::Tensor& x) {
  at::NoGradGuard no_grad;
  return model.forward({x.to(device)}).toTensor().cpu();
}

// A differently initialised copy restored from the checkpoint onto `device`.
struct RestoredCopy {
  torch::jit::Module model;
  int64_t step = 0;
  double load_seconds = 0;
};
RestoredCopy restore(const std::string& checkpoint_path, c10::Device device) {
  RestoredCopy copy{validation::make_builtin_model("transformer", /*seed=*/77)};
  auto optimizer = make_optimizer(copy.model);
  checkpoint::RestoreOptions options;
  options.device_map = {{"", device}};
  const auto start = Clock::now();
  copy.step = checkpoint::load_training_state(checkpoint_path, copy.model, *optimizer, options).step;
  copy.load_seconds = since(start);
  return copy;
}

// The checkpoint loaded on `name` and its outputs compared with the trained model's; whether
// that passes is decided by the caller, which knows how many steps were trained.
nlohmann::json check_load(const std::string& name, const std::string& checkpoint_path, const at::Tensor& batch,
                          const at::Tensor& trained_outputs) {
  const c10::Device device = create_backend(name)->device(0);
  RestoredCopy copy = restore(checkpoint_path, device);
  const at::Tensor outputs = outputs_on_cpu(copy.model, device, batch);
  const double max_abs = (outputs - trained_outputs).abs().max().item<double>();
  const double rel_l2 = ((outputs - trained_outputs).norm() / trained_outputs.norm()).item<double>();
  return {{"backend", name},         {"device", device.str()},  {"load_seconds", copy.load_seconds},
          {"max_abs_diff", max_abs}, {"rel_l2_diff", rel_l2},   {"step", copy.step}};
}

validation::ValidationReport validate(const torch::jit::Module& model, const std::vector<std::string>& backends,
                                      bool checkpointing, const std::function<void(const std::string&)>& stage) {
  validation::ValidatorOptions options;
  options.backends = backends;
  options.checkpointing = checkpointing;
  options.progress = [&](const std::string& backend, const std::string& step, int, int) {
    if (step != "done") stage("validating: " + backend + " " + step);
  };
  return validation::Validator(options).validate(
      *validation::model_from(model),
      std::vector<std::vector<int64_t>>{validation::builtin_model_info("transformer").input_shape});
}

// --check-checkpoint: describe, load and validate `backends` in this (child) process, as JSON.
int run_backend_check(const ParsedArguments& parsed) {
  const std::string* reference_path = parsed.option("--reference-outputs");
  const std::string* backend_list = parsed.option("--backends");
  if (!reference_path || !backend_list) {
    throw UsageError("--check-checkpoint needs --reference-outputs FILE and --backends LIST");
  }
  const std::string& checkpoint_path = *parsed.option("--check-checkpoint");
  const std::vector<std::string> backends = split_list(*backend_list, "--backends");
  const auto references = checkpoint::SafetensorsFile::open(*reference_path);
  const at::Tensor batch = references.load("batch"), trained_outputs = references.load("outputs");

  nlohmann::json out = {{"hardware", nlohmann::json::array()}, {"loads", nlohmann::json::array()}};
  for (const auto& name : backends) {
    out["hardware"].push_back(describe_backend(name, *create_backend(name)));  // loads an SDK device
    out["loads"].push_back(check_load(name, checkpoint_path, batch, trained_outputs));
  }
  RestoredCopy trained = restore(checkpoint_path, c10::Device(c10::kCPU));
  const auto report = validate(trained.model, backends, parsed.has("--checkpointing"), [](const std::string&) {});
  out["validation"] = nlohmann::json::parse(validation::report_json(report));
  std::cout << printable_json(out) << "\n";
  return 0;
}

struct ChildFindings {
  nlohmann::json hardware = nlohmann::json::array();
  nlohmann::json loads = nlohmann::json::array();
  validation::ValidationReport validation;
};

// `portability --check-checkpoint` for one backend in a child process. A child that ends without
// findings becomes a failed load and a failed validation check saying how it ended.
ChildFindings check_in_child(const std::string& name, const std::string& checkpoint_path,
                             const std::string& reference_path, bool checkpointing) {
  ChildFindings findings;
  std::string failure;
  try {
    std::vector<std::string> child_args = {"portability", "--check-checkpoint", checkpoint_path,
                                           "--reference-outputs", reference_path, "--backends", name};
    if (checkpointing) child_args.push_back("--checkpointing");
    const ChildResult child = run_self(child_args);
    try {
      const auto parsed = nlohmann::json::parse(child.out);
      findings.hardware = parsed.at("hardware");
      findings.loads = parsed.at("loads");
      findings.validation = validation::report_from_json(parsed.at("validation").dump());
      return findings;
    } catch (const std::exception&) {
      failure = "the child process checking it " + child.describe_exit() + " without a result";
      if (const std::string line = child.last_error_line(); !line.empty()) failure += ": " + line;
    }
  } catch (const std::exception& e) {
    failure = std::string("cannot start a child process to check it: ") + e.what();
  }
  findings.hardware.push_back({{"backend", name}, {"available", false}, {"reason", failure}});
  findings.loads.push_back({{"backend", name}, {"device", name}, {"error", failure}});
  findings.validation.backends = {name};
  findings.validation.checks.push_back({name, name, validation::CheckKind::kRun, "model", false, std::nullopt, failure});
  return findings;
}

void print_report(const nlohmann::json& r) {
  std::cout << "== Hardware\n";
  for (const auto& b : r["hardware"]) {
    std::cout << "  " << column(b["backend"].get<std::string>(), 14);
    if (b["available"].get<bool>()) {
      std::cout << "available";
      for (const auto& d : b["devices"]) std::cout << "  [" << d.get<std::string>() << "]";
      if (b.value("own_process", false)) std::cout << "  (checked in its own process)";
    } else {
      std::cout << "not available: " << b["reason"].get<std::string>();
    }
    std::cout << "\n";
  }
  const auto& t = r["training"];
  std::cout << "\n== Training on " << t["backend"].get<std::string>() << " (" << t["device"].get<std::string>()
            << ")\n  built-in transformer, " << t["parameters"].get<int64_t>() << " parameters, " << t["steps"].get<int>()
            << " Adam steps" << (t.value("checkpointing", false) ? " through activation checkpointing" : "") << " in "
            << fixed(t["seconds"], 2) << " s\n  loss " << scientific(t["first_loss"]) << " -> "
            << scientific(t["last_loss"]) << " (mean of the first and last 10 steps)\n";
  if (t["last_loss"].get<double>() >= t["first_loss"].get<double>()) std::cout << "  FAILED the loss did not fall\n";
  const auto& c = r["checkpoint"];
  std::cout << "\n== Portable checkpoint\n  "
            << (c["path"].is_null() ? std::string("in a temporary directory, removed at the end (--output DIR keeps it)")
                                    : c["path"].get<std::string>())
            << "\n  "
            << format_bytes(c["bytes"].get<int64_t>()) << ", saved in " << fixed(c["save_seconds"].get<double>() * 1000, 1)
            << " ms\n";
  std::cout << "\n== Loaded on every backend (outputs on one batch vs the trained model on "
            << t["backend"].get<std::string>() << ")\n";
  for (const auto& l : r["loads"]) {
    std::cout << "  " << column(l["backend"].get<std::string>(), 8) << column(l["device"].get<std::string>(), 8);
    if (l.contains("error")) {
      std::cout << "FAILED: " << l["error"].get<std::string>() << "\n";
      continue;
    }
    std::cout << "load " << fixed(l["load_seconds"].get<double>() * 1000, 1) << " ms   max abs diff "
              << scientific(measured(l["max_abs_diff"])) << "   rel L2 " << scientific(measured(l["rel_l2_diff"]))
              << "   "
              << (l["passed"].get<bool>() ? "same" : "DIFFERENT") << "\n";
  }
  const auto& v = r["validation"];
  std::cout << "\n== Validation against " << v["reference"].get<std::string>() << " (" << v["precision"].get<std::string>()
            << (v.value("checkpointing", false) ? ", checkpointed training" : "") << ")\n";
  for (const auto& b : v["backends"]) {
    std::cout << "  " << column(b["backend"].get<std::string>(), 8) << b["passed"].get<int>() << "/" << b["total"].get<int>()
              << " checks passed   worst output rel L2 " << scientific(measured(b["worst_output_rel_l2"]))
              << "   worst gradient rel L2 " << scientific(measured(b["worst_gradient_rel_l2"])) << "   "
              << fixed(b["seconds"], 2) << " s\n";
  }
  for (const auto& f : v["failures"]) std::cout << "  FAILED " << f.get<std::string>() << "\n";
  std::cout << "\n== Result: " << (r["passed"].get<bool>() ? "PORTABLE" : "NOT PORTABLE") << " (total "
            << fixed(r["seconds"], 1) << " s)\n";
}

// Per backend: checks passed, the worst output and gradient errors, the time spent.
nlohmann::json summarize_validation(const validation::ValidationReport& report) {
  nlohmann::json per_backend = nlohmann::json::array(), failures = nlohmann::json::array();
  for (const auto& backend : report.backends) {
    int passed = 0, total = 0;
    // null until a check measures one, NaN once one is NaN: a backend whose checks never ran
    // reported 0.0 ("Unknown values are null, never a made-up number", docs/cli-json.md).
    std::optional<double> worst_output, worst_gradient;
    const auto keep_worst = [](std::optional<double>& worst, double value) {
      if (worst && std::isnan(*worst)) return;  // a NaN error stays the worst
      if (!worst || std::isnan(value) || value > *worst) worst = value;
    };
    for (const auto& c : report.checks) {
      if (c.backend != backend) continue;
      ++total;
      passed += c.passed ? 1 : 0;
      if (!c.passed) failures.push_back(c.backend + " " + validation::check_name(c.check) + " " + c.subject + ": " + c.detail);
      if (c.metrics && c.check == validation::CheckKind::kOutput) keep_worst(worst_output, c.metrics->rel_l2_error);
      if (c.metrics && c.check == validation::CheckKind::kGradient) keep_worst(worst_gradient, c.metrics->rel_l2_error);
    }
    const auto json_of = [](const std::optional<double>& value) {
      return value && !std::isnan(*value) ? nlohmann::json(*value) : nlohmann::json(nullptr);
    };
    double seconds = 0;
    for (const auto& t : report.timings) seconds += t.backend == backend ? t.seconds : 0;
    per_backend.push_back({{"backend", backend}, {"passed", passed}, {"total", total},
                           {"worst_output_rel_l2", json_of(worst_output)},
                           {"worst_gradient_rel_l2", json_of(worst_gradient)},
                           {"seconds", seconds}});
  }
  return {{"reference", report.reference}, {"precision", name_of(report.precision)}, {"valid", report.is_valid()},
          {"checkpointing", report.checkpointing}, {"backends", per_backend}, {"failures", failures}};
}

// The SDK device TORCHBRIDGE_BACKEND names, "" when it names none (unset, "auto", a native
// backend, or a name detect_best_backend() will refuse with its own message).
std::string forced_sdk_device() {
  const char* forced = std::getenv(kBackendEnvVar);
  if (forced == nullptr || *forced == '\0') return "";
  try {
    if (BackendRegistry::instance().device_type_of(forced) == c10::DeviceType::PrivateUse1) return forced;
  } catch (const c10::Error&) {
  }
  return "";
}

}  // namespace

int run_portability(const std::vector<std::string>& args) {
  const ParsedArguments parsed =
      parse_arguments("portability", args,
                      {{"--json", "--isolate", "--checkpointing"},
                       {"--steps", "--output", "--check-checkpoint", "--reference-outputs", "--backends"},
                       false});
  if (parsed.has("--help")) {
    std::cout << kHelp;
    return 0;
  }
  if (parsed.option("--check-checkpoint")) return run_backend_check(parsed);
  if (parsed.option("--reference-outputs") || parsed.option("--backends")) {
    throw UsageError("--reference-outputs and --backends belong to --check-checkpoint");
  }
  const int steps = parse_steps(parsed.option("--steps"));
  // Without --output the checkpoint (and the child processes' reference outputs) live in a
  // temporary directory removed when the run ends: a run repeated leaves nothing behind in /tmp.
  std::optional<TemporaryDirectory> scratch;
  if (!parsed.option("--output")) scratch.emplace("torchbridge-portability");
  const std::string directory = scratch ? scratch->path() : prepare_output_directory(*parsed.option("--output"));
  const bool checkpointing = parsed.has("--checkpointing");
  const bool json = parsed.has("--json");
  const auto start = Clock::now();
  // Stage lines are redrawn with "\r\033[K", which a dumb terminal prints as they are.
  const char* terminal = std::getenv("TERM");
  const bool progress = !json && isatty(STDERR_FILENO) != 0 && !(terminal && std::string(terminal) == "dumb");
  const auto stage = [&](const std::string& text) {
    if (progress) std::cerr << "\r\033[K" << text << std::flush;
  };

  // Which backends run here and which in a child process. The SDK device is loaded here only when
  // it can share the process: before the first backward pass (PyTorch sizes its autograd device
  // queues once), and before the best backend is chosen (emu never outranks real hardware).
  stage("detecting hardware");
  std::vector<std::string> candidates;
  for (const auto& entry : BackendRegistry::instance().entries()) {
    const bool sdk = entry.backend->device_type() == c10::DeviceType::PrivateUse1;
    if (!sdk && entry.backend->is_available()) candidates.push_back(entry.name);
  }
  const bool sdk_device_present = [] {
    const auto found = sdk::available_devices();
    return std::find(found.begin(), found.end(), kSdkDevice) != found.end();
  }();
  if (sdk_device_present) candidates.push_back(kSdkDevice);
  // A vendor's SDK device named by TORCHBRIDGE_BACKEND is trained on here; with emu beside it, each
  // needs a process of its own (one PrivateUse1 slot), which the isolation below arranges.
  if (const std::string target = forced_sdk_device(); !target.empty() && target != kSdkDevice) {
    candidates.push_back(target);
  }
  std::vector<std::string> isolated = sdk_devices_needing_own_process(candidates);
  if (parsed.has("--isolate") || !isolated.empty()) {
    const std::string best = detect_best_backend();  // SDK device not loaded: the best native one
    isolated.clear();
    for (const auto& name : candidates) {
      if (BackendRegistry::instance().device_type_of(name) != c10::DeviceType::CPU && name != best) {
        isolated.push_back(name);
      }
    }
  } else if (sdk_device_present) {
    create_backend(kSdkDevice);
  }
  const auto runs_here = [&](const std::string& name) {
    return std::find(isolated.begin(), isolated.end(), name) == isolated.end();
  };

  nlohmann::json report, hardware = nlohmann::json::array();
  std::vector<std::string> backends;  // every usable backend, in detection order
  for (const auto& entry : BackendRegistry::instance().entries()) {
    if (!runs_here(entry.name)) continue;
    if (entry.backend->device_type() == c10::DeviceType::PrivateUse1 && !entry.backend->is_available()) continue;
    hardware.push_back(describe_backend(entry.name, *entry.backend));
    if (entry.backend->is_available()) backends.push_back(entry.name);
  }
  const std::string best = detect_best_backend();
  const c10::Device train_device = create_backend(best)->device(0);

  stage("training on " + best);
  TrainingRun run = train_transformer(train_device, steps, /*seed=*/0, checkpointing);
  int64_t parameter_count = 0;
  for (const auto& p : run.model.parameters()) parameter_count += p.numel();
  report["training"] = {{"backend", best},          {"device", train_device.str()}, {"steps", run.steps},
                        {"parameters", parameter_count}, {"seconds", run.seconds},
                        {"first_loss", run.first_loss}, {"last_loss", run.last_loss},
                        {"checkpointing", checkpointing}};

  stage("saving the checkpoint");
  const std::string path = directory + "/transformer.safetensors";
  auto save_start = Clock::now();
  checkpoint::save_training_state(path, run.model, *run.optimizer,
                                  {run.steps, 0, {{"model", "builtin:transformer"}, {"trained_on", best}}});
  // path: null when the checkpoint goes with the temporary directory at the end of the run.
  report["checkpoint"] = {{"path", scratch ? nlohmann::json(nullptr) : nlohmann::json(path)},
                          {"bytes", std::filesystem::file_size(path)}, {"save_seconds", since(save_start)}};

  const at::Tensor batch = evaluation_batch();
  const at::Tensor trained_outputs = outputs_on_cpu(run.model, train_device, batch);
  nlohmann::json loads = nlohmann::json::array();
  for (const auto& name : backends) {
    stage("loading on " + name);
    loads.push_back(check_load(name, path, batch, trained_outputs));
  }
  std::vector<validation::ValidationReport> validation_parts = {validate(run.model, backends, checkpointing, stage)};

  if (!isolated.empty()) {
    const std::string reference_path = directory + "/reference_outputs.safetensors";
    checkpoint::save(reference_path, {{"batch", batch}, {"outputs", trained_outputs}});
    for (const auto& name : isolated) {
      stage("checking " + name + " in a child process");
      ChildFindings findings = check_in_child(name, path, reference_path, checkpointing);
      for (auto& item : findings.hardware) {
        item["own_process"] = true;
        hardware.push_back(item);
      }
      for (const auto& item : findings.loads) loads.push_back(item);
      validation_parts.push_back(std::move(findings.validation));
      backends.push_back(name);
    }
  }
  report["hardware"] = hardware;

  const Bound& tolerance = spec_of(Precision::kFp32).output;
  bool loads_passed = true;
  for (auto& load : loads) {
    const bool passed = !load.contains("error") && load["step"].get<int64_t>() == run.steps &&
                        measured(load["rel_l2_diff"]) <= tolerance.rtol;
    load["passed"] = passed;
    loads_passed = loads_passed && passed;
  }
  report["loads"] = loads;
  const auto validation_report = merge_reports(validation_parts, backends);
  report["validation"] = summarize_validation(validation_report);
  const bool passed = run.last_loss < run.first_loss && loads_passed && validation_report.is_valid();
  report["passed"] = passed;
  report["seconds"] = since(start);
  if (progress) std::cerr << "\r\033[K" << std::flush;
  if (json) {
    std::cout << printable_json(report, 2) << "\n";
  } else {
    print_report(report);
  }
  return passed ? 0 : 1;
}

}  // namespace torchbridge::cli
