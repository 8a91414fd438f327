// `torchbridge portability`: the README's main job. Detects the hardware, trains the built-in
// transformer on the best backend, saves a portable training state, loads it on every other
// backend (the CPU and emu at least), validates that all compute the same thing, and reports.
#include "arguments.h"
#include "commands.h"
#include "portability_training.h"
#include "text_format.h"

#include <torchbridge/checkpoint/training_state.h>
#include <torchbridge/registry.h>
#include <torchbridge/validation/builtin_models.h>
#include <torchbridge/validation/tolerances.h>
#include <torchbridge/validation/validator.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>

namespace torchbridge::cli {
namespace {

constexpr const char* kHelp = R"(usage: torchbridge portability [--steps N] [--output DIR] [--json]

The portability run: detect the hardware, train the built-in transformer on the best available
backend, save a portable checkpoint (model, Adam state, RNG, counters) as safetensors, load it
on every other backend (available accelerators, the CPU, and the emulated device emu), check
that every copy computes the same outputs, and validate the model on all of them against the
CPU in float64. Exit 0 only when training reduced the loss and every check passed.

  --steps N     training steps (default 300)
  --output DIR  where the checkpoint goes (default: a new directory under $TMPDIR or /tmp)
  --json        the report as JSON
)";

using Clock = std::chrono::steady_clock;
double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int parse_steps(const std::string* text) {
  if (!text) return 300;
  try {
    size_t used = 0;
    const int steps = std::stoi(*text, &used);
    if (used == text->size() && steps >= 10 && steps <= 100000) return steps;
  } catch (const std::exception&) {
  }
  throw UsageError("--steps '" + *text + "' is not a whole number from 10 to 100000");
}

std::string make_output_directory(const std::string* requested) {
  if (requested) {
    std::filesystem::create_directories(*requested);
    return *requested;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/torchbridge-portability-XXXXXX";
  if (!mkdtemp(pattern.data())) throw std::runtime_error("cannot create a directory from " + pattern);
  return pattern;
}

// Every backend that can run here: the available ones, plus emu, which any machine can load.
// The SDK device is loaded now, before the first backward pass (PyTorch sizes its autograd
// device queues once), and before the best backend is chosen (emu never outranks real hardware).
std::vector<std::string> usable_backends(nlohmann::json& hardware) {
  create_backend("emu");
  std::vector<std::string> names;
  for (const auto& entry : BackendRegistry::instance().entries()) {
    const Availability availability = entry.backend->availability();
    nlohmann::json item = {{"backend", entry.name}, {"available", availability.available()}};
    if (!availability.available()) {
      item["reason"] = availability.reason;
    } else {
      names.push_back(entry.name);
      nlohmann::json devices = nlohmann::json::array();
      for (int i = 0; i < entry.backend->device_count(); ++i) devices.push_back(entry.backend->info(i).name);
      item["devices"] = devices;
    }
    hardware.push_back(item);
  }
  return names;
}

at::Tensor evaluation_batch() {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(12345);
  return at::randn(validation::builtin_model_info("transformer").input_shape, generator, at::TensorOptions());
}

at::Tensor outputs_on_cpu(torch::jit::Module& model, c10::Device device, const at::Tensor& x) {
  at::NoGradGuard no_grad;
  return model.forward({x.to(device)}).toTensor().cpu();
}

void print_report(const nlohmann::json& r) {
  std::cout << "== Hardware\n";
  for (const auto& b : r["hardware"]) {
    std::cout << "  " << column(b["backend"].get<std::string>(), 14);
    if (b["available"].get<bool>()) {
      std::cout << "available";
      for (const auto& d : b["devices"]) std::cout << "  [" << d.get<std::string>() << "]";
    } else {
      std::cout << "not available: " << b["reason"].get<std::string>();
    }
    std::cout << "\n";
  }
  const auto& t = r["training"];
  std::cout << "\n== Training on " << t["backend"].get<std::string>() << " (" << t["device"].get<std::string>()
            << ")\n  built-in transformer, " << t["parameters"].get<int64_t>() << " parameters, " << t["steps"].get<int>()
            << " Adam steps in " << fixed(t["seconds"], 2) << " s\n  loss " << scientific(t["first_loss"]) << " -> "
            << scientific(t["last_loss"]) << " (mean of the first and last 10 steps)\n";
  const auto& c = r["checkpoint"];
  std::cout << "\n== Portable checkpoint\n  " << c["path"].get<std::string>() << "\n  "
            << format_bytes(c["bytes"].get<int64_t>()) << ", saved in " << fixed(c["save_seconds"].get<double>() * 1000, 1)
            << " ms\n";
  std::cout << "\n== Loaded on every backend (outputs on one batch vs the trained model on "
            << t["backend"].get<std::string>() << ")\n";
  for (const auto& l : r["loads"]) {
    std::cout << "  " << column(l["backend"].get<std::string>(), 8) << column(l["device"].get<std::string>(), 8)
              << "load " << fixed(l["load_seconds"].get<double>() * 1000, 1) << " ms   max abs diff "
              << scientific(l["max_abs_diff"]) << "   rel L2 " << scientific(l["rel_l2_diff"]) << "   "
              << (l["passed"].get<bool>() ? "same" : "DIFFERENT") << "\n";
  }
  const auto& v = r["validation"];
  std::cout << "\n== Validation against " << v["reference"].get<std::string>() << " (" << v["precision"].get<std::string>()
            << ")\n";
  for (const auto& b : v["backends"]) {
    std::cout << "  " << column(b["backend"].get<std::string>(), 8) << b["passed"].get<int>() << "/" << b["total"].get<int>()
              << " checks passed   worst output rel L2 " << scientific(b["worst_output_rel_l2"])
              << "   worst gradient rel L2 " << scientific(b["worst_gradient_rel_l2"]) << "   "
              << fixed(b["seconds"], 2) << " s\n";
  }
  for (const auto& f : v["failures"]) std::cout << "  FAILED " << f.get<std::string>() << "\n";
  std::cout << "\n== Result: " << (r["passed"].get<bool>() ? "PORTABLE" : "NOT PORTABLE") << " (total "
            << fixed(r["seconds"], 1) << " s)\n";
}

}  // namespace

int run_portability(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments("portability", args, {{"--json"}, {"--steps", "--output"}, false});
  if (parsed.has("--help")) {
    std::cout << kHelp;
    return 0;
  }
  const int steps = parse_steps(parsed.option("--steps"));
  const bool json = parsed.has("--json");
  const auto start = Clock::now();
  const bool progress = !json && isatty(STDERR_FILENO) != 0;
  const auto stage = [&](const std::string& text) {
    if (progress) std::cerr << "\r\033[K" << text << std::flush;
  };

  nlohmann::json report, hardware = nlohmann::json::array();
  stage("detecting hardware");
  const std::vector<std::string> backends = usable_backends(hardware);
  report["hardware"] = hardware;
  const std::string best = detect_best_backend();
  const c10::Device train_device = create_backend(best)->device(0);

  stage("training on " + best);
  TrainingRun run = train_transformer(train_device, steps, /*seed=*/0);
  int64_t parameter_count = 0;
  for (const auto& p : run.model.parameters()) parameter_count += p.numel();
  report["training"] = {{"backend", best},          {"device", train_device.str()}, {"steps", run.steps},
                        {"parameters", parameter_count}, {"seconds", run.seconds},
                        {"first_loss", run.first_loss}, {"last_loss", run.last_loss}};

  stage("saving the checkpoint");
  const std::string path = make_output_directory(parsed.option("--output")) + "/transformer.safetensors";
  auto save_start = Clock::now();
  checkpoint::save_training_state(path, run.model, *run.optimizer,
                                  {run.steps, 0, {{"model", "builtin:transformer"}, {"trained_on", best}}});
  report["checkpoint"] = {{"path", path}, {"bytes", std::filesystem::file_size(path)}, {"save_seconds", since(save_start)}};

  const at::Tensor batch = evaluation_batch();
  const at::Tensor trained_outputs = outputs_on_cpu(run.model, train_device, batch);
  const auto& tolerance = validation::tolerance_for("fp32").output;
  bool loads_passed = true;
  report["loads"] = nlohmann::json::array();
  for (const auto& name : backends) {
    stage("loading on " + name);
    const c10::Device device = create_backend(name)->device(0);
    // A differently initialised copy, so every value must come from the checkpoint.
    torch::jit::Module copy = validation::make_builtin_model("transformer", /*seed=*/77);
    auto optimizer = make_optimizer(copy);
    checkpoint::RestoreOptions options;
    options.device_map = {{"", device}};
    const auto load_start = Clock::now();
    const auto saved = checkpoint::load_training_state(path, copy, *optimizer, options);
    const double load_seconds = since(load_start);
    const at::Tensor outputs = outputs_on_cpu(copy, device, batch);
    const double max_abs = (outputs - trained_outputs).abs().max().item<double>();
    const double rel_l2 = ((outputs - trained_outputs).norm() / trained_outputs.norm()).item<double>();
    const bool passed = saved.step == run.steps && rel_l2 <= tolerance.rtol;
    loads_passed = loads_passed && passed;
    report["loads"].push_back({{"backend", name}, {"device", device.str()}, {"load_seconds", load_seconds},
                               {"max_abs_diff", max_abs}, {"rel_l2_diff", rel_l2}, {"passed", passed}});
  }

  validation::ValidatorOptions options;
  options.backends = backends;
  options.progress = [&](const std::string& backend, const std::string& step, int, int) {
    if (step != "done") stage("validating: " + backend + " " + step);
  };
  const auto validation_report =
      validation::Validator(options).validate(*validation::model_from(run.model),
                                              std::vector<std::vector<int64_t>>{validation::builtin_model_info("transformer").input_shape});
  nlohmann::json per_backend = nlohmann::json::array(), failures = nlohmann::json::array();
  for (size_t b = 0; b < backends.size(); ++b) {
    int passed = 0, total = 0;
    double worst_output = 0, worst_gradient = 0;
    for (const auto& c : validation_report.checks) {
      if (c.backend != backends[b]) continue;
      ++total;
      passed += c.passed ? 1 : 0;
      if (!c.passed) failures.push_back(c.backend + " " + c.check + " " + c.subject + ": " + c.detail);
      if (c.metrics && c.check == "output") worst_output = std::max(worst_output, c.metrics->rel_l2_error);
      if (c.metrics && c.check == "gradient") worst_gradient = std::max(worst_gradient, c.metrics->rel_l2_error);
    }
    per_backend.push_back({{"backend", backends[b]}, {"passed", passed}, {"total", total},
                           {"worst_output_rel_l2", worst_output}, {"worst_gradient_rel_l2", worst_gradient},
                           {"seconds", validation_report.timings[b].seconds}});
  }
  report["validation"] = {{"reference", validation_report.reference}, {"precision", validation_report.precision},
                          {"valid", validation_report.is_valid()}, {"backends", per_backend}, {"failures", failures}};
  const bool passed = run.last_loss < run.first_loss && loads_passed && validation_report.is_valid();
  report["passed"] = passed;
  report["seconds"] = since(start);
  if (progress) std::cerr << "\r\033[K" << std::flush;
  if (json) {
    std::cout << report.dump(2) << "\n";
  } else {
    print_report(report);
  }
  return passed ? 0 : 1;
}

}  // namespace torchbridge::cli
