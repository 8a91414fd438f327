// FP8 against BF16 at one matmul size, measured in the same run on the same device:
//   matmul   at::mm of two bf16 [N, N] matrices  vs  amp::fp8_matmul of their e4m3 quantizations
//   linear   torch::nn::Linear(N, N) forward + backward under bf16 autocast, batch N
//            vs  amp::Fp8Linear(N, N), the same (quantization and delayed scaling included)
//   quantize amp::quantize_delayed of a float32 [N, N] tensor (what Fp8Linear does to each operand,
//            every step)  vs  a copy of that tensor: memory-bound both, so the ratio counts passes
// Prints one JSON line with the median milliseconds and the ratios bf16 / fp8 (> 1: FP8 faster).
// Issue 14's goal is >= 1.3x for the linear at N = 8192 on an H100 (torch._scaled_mm). On devices
// without FP8 units the FP8 path is the emulation (dequantize + float32 matmul), so the ratio there
// measures the emulation's cost, not a speed-up.
//   fp8_benchmark [BACKEND=cpu] [N=1024] [REPEATS=5] [PARTS=matmul,linear,quantize]
// PARTS picks what runs (a comma list): on CPUs without bf16 matrix instructions a bf16 matmul at
// N = 2048 takes about a minute, and the quantization can be measured without it.
#include "median_seconds.h"

#include <torchbridge/amp/autocast_scope.h>
#include <torchbridge/amp/fp8.h>
#include <torchbridge/amp/fp8_linear.h>
#include <torchbridge/backend.h>
#include <torchbridge/parse_integer.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

namespace {

// The parts of PARTS (comma-separated); an unknown name is an error naming it.
std::set<std::string> parse_parts(const std::string& list) {
  const std::set<std::string> known{"matmul", "linear", "quantize"};
  std::set<std::string> parts;
  std::stringstream stream(list);
  for (std::string part; std::getline(stream, part, ',');) {
    if (known.count(part) == 0) {
      throw std::invalid_argument("unknown part '" + part + "' in '" + list +
                                  "': expected a comma list of matmul, linear, quantize");
    }
    parts.insert(part);
  }
  if (parts.empty()) {
    throw std::invalid_argument("PARTS is empty: expected a comma list of matmul, linear, quantize");
  }
  return parts;
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace torchbridge;
  const std::string backend_name = argc > 1 ? argv[1] : "cpu";
  const int64_t n = argc > 2 ? parse_integer(argv[2], "N", 1, 1 << 16) : 1024;
  const int repeats = argc > 3 ? static_cast<int>(parse_integer(argv[3], "REPEATS", 1, 1000)) : 5;
  const std::set<std::string> parts = parse_parts(argc > 4 ? argv[4] : "matmul,linear,quantize");
  const std::shared_ptr<Backend> backend = create_backend(backend_name);
  const c10::Device device = backend->device(0);
  auto timed_ms = [&](auto&& body) {
    return 1e3 * median_seconds(repeats, [&] {
      body();
      backend->synchronize(0);
    });
  };
  at::manual_seed(0);
  const auto options = at::TensorOptions().device(device);
  const at::Tensor a = at::randn({n, n}, options), b = at::randn({n, n}, options);
  const char* kernel = amp::to_string(amp::resolve_fp8_matmul_kernel(amp::Fp8MatmulKernel::kAuto, device));
  std::printf("{\"device\": \"%s\", \"n\": %lld, \"fp8_matmul\": \"%s\"", device.str().c_str(),
              static_cast<long long>(n), kernel);

  if (parts.count("matmul")) {
    const at::Tensor a16 = a.to(at::kBFloat16), b16 = b.to(at::kBFloat16);
    amp::Fp8ScalingState sa = amp::Fp8ScalingState::create(1, device), sb = amp::Fp8ScalingState::create(1, device);
    const amp::Fp8Tensor a8 = amp::quantize_delayed(a, amp::Fp8Format::kE4M3, {1, 0}, sa);
    const amp::Fp8Tensor b8 = amp::quantize_delayed(b, amp::Fp8Format::kE4M3, {1, 0}, sb);
    const at::Tensor b8_t = b8.data.t();  // [N, N] column-major: the layout _scaled_mm takes without a copy
    const double mm_bf16 = timed_ms([&] { (void)at::mm(a16, b16); });
    const double mm_fp8 = timed_ms([&] {
      (void)amp::fp8_matmul(a8.data, a8.scale_inverse, b8_t, b8.scale_inverse, at::kBFloat16);
    });
    std::printf(", \"matmul_bf16_ms\": %.3f, \"matmul_fp8_ms\": %.3f, \"matmul_ratio\": %.3f", mm_bf16, mm_fp8,
                mm_bf16 / mm_fp8);
  }

  if (parts.count("linear")) {
    torch::nn::Linear linear(n, n);
    linear->to(device);
    amp::Fp8Linear fp8_linear(*linear, amp::DelayedScalingOptions{});
    const at::Tensor x = at::randn({n, n}, options).set_requires_grad(true);
    auto train_step = [&](auto& layer) {
      amp::AutocastScope autocast(device.type(), amp::AutocastOptions{at::kBFloat16});
      layer->forward(x).sum().backward();
    };
    const double linear_bf16 = timed_ms([&] { train_step(linear); });
    const double linear_fp8 = timed_ms([&] { train_step(fp8_linear); });
    std::printf(", \"linear_train_bf16_ms\": %.3f, \"linear_train_fp8_ms\": %.3f, \"linear_ratio\": %.3f",
                linear_bf16, linear_fp8, linear_bf16 / linear_fp8);
  }

  if (parts.count("quantize")) {
    // How many copies' worth of memory traffic one quantization costs: reading the input for its
    // amax, scaling, saturating and the cast to float8 each pass over the data.
    amp::Fp8ScalingState state = amp::Fp8ScalingState::create(16, device);
    const double copy_ms = timed_ms([&] { (void)a.clone(); });
    const double quantize_ms = timed_ms([&] { (void)amp::quantize_delayed(a, amp::Fp8Format::kE4M3, {16, 0}, state); });
    std::printf(", \"copy_ms\": %.3f, \"quantize_ms\": %.3f, \"quantize_vs_copy\": %.2f", copy_ms, quantize_ms,
                quantize_ms / copy_ms);
  }
  std::printf("}\n");
  return 0;
} catch (const c10::Error& error) {
  std::fprintf(stderr, "fp8_benchmark: %s\n", error.msg().c_str());
  return 1;
} catch (const std::exception& error) {
  std::fprintf(stderr, "fp8_benchmark: %s\n", error.what());
  return 1;
}
