#pragma once
// FP8 building blocks: per-tensor delayed scaling and the scaled matmul, the recipe of Transformer
// Engine and torchao's float8 training. An operand is quantized as q = saturate(x * scale) in
// float8, and a matmul of two quantized operands is (qa * 1/scale_a) @ (qb * 1/scale_b).
//
// Delayed scaling: the scale used for a tensor comes from the largest absolute value (amax) seen
// over its last N quantizations, not from the tensor itself, so computing it needs no pass over
// the data before the cast and no host synchronisation. Everything stays on the device.
//
// Where the device has FP8 matrix units for these formats (NVIDIA sm_89+) the matmul is
// torch._scaled_mm; everywhere else it is emulated with the same numerics (dequantize, then a
// float32 matmul), so the FP8 code path is tested on every machine.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace torchbridge::amp {

// e4m3 (3 mantissa bits, max 448) for activations and weights, e5m2 (max 57344, more range) for
// gradients, as in the published FP8 training recipes.
enum class Fp8Format { kE4M3, kE5M2 };

c10::ScalarType fp8_scalar_type(Fp8Format format);  // Float8_e4m3fn / Float8_e5m2
double fp8_max(Fp8Format format);                   // largest finite value: 448 / 57344
const char* to_string(Fp8Format format);            // "e4m3" / "e5m2"
// "e4m3" or "e5m2"; anything else raises c10::ValueError naming it.
Fp8Format parse_fp8_format(std::string_view name);

struct DelayedScalingOptions {
  int64_t amax_history_length = 16;  // how many past amaxes the scale is taken over
  int64_t margin = 0;                // scale = fp8_max / (amax * 2^margin): headroom for growth
  // Raises c10::ValueError naming the bad value: length must be >= 1, margin in [0, 64].
  void validate() const;
};

// The scaling state of one quantized operand (a layer's input, its weight, its output gradient).
// Both tensors are float32 and live on the operand's device; a module registers them as buffers.
struct Fp8ScalingState {
  at::Tensor amax_history;  // [amax_history_length], newest first; zeros until the first quantization
  at::Tensor scale;         // [] the scale of the latest quantization (1 before the first)

  static Fp8ScalingState create(int64_t amax_history_length, c10::Device device);
};

// A quantized tensor and the factor that turns it back into the original values.
struct Fp8Tensor {
  at::Tensor data;           // float8, same shape as the input
  at::Tensor scale_inverse;  // [] float32, 1 / scale (a new tensor: it stays valid after the state moves on)
};

// Quantizes `input` with delayed scaling and updates `state` in place:
//  1. scale = fp8_max(format) / (max(amax_history) * 2^margin); on the first call (the history is
//     still zeros) the input's own amax is used. When that amax is zero, inf or NaN the previous
//     scale is kept.
//  2. The input's amax enters the history (oldest dropped); a non-finite amax is recorded as 0,
//     so one overflowing step does not poison the next amax_history_length scales.
//  3. data = clamp(input * scale, -fp8_max, fp8_max) cast to float8 (saturating, as TE does).
// An empty input (a batch of no tokens) leaves the state as it is and gives empty data.
// Autocast does not apply inside. The history's length must match options.amax_history_length.
// While activation checkpointing recomputes a region, steps 1 and 2 do not run: the state stays as
// it is and step 3 uses the scale this state had in the region's forward pass, so the backward
// pass sees the forward's numbers and every step is recorded once (torchbridge/recomputation.h).
Fp8Tensor quantize_delayed(const at::Tensor& input, Fp8Format format, const DelayedScalingOptions& options,
                           Fp8ScalingState& state);

// The same, writing the float8 values into `data` (float8 of `format`, the input's shape and
// device; c10::ValueError otherwise) instead of a new tensor; returns 1 / scale. For callers that
// allocate results themselves (the Python layer), without a copy.
at::Tensor quantize_delayed_into(const at::Tensor& data, const at::Tensor& input, Fp8Format format,
                                 const DelayedScalingOptions& options, Fp8ScalingState& state);

// How a matmul of two FP8 operands is computed.
enum class Fp8MatmulKernel {
  kAuto,       // kScaledMm where the device has FP8 matrix units, kEmulated elsewhere
  kScaledMm,   // torch._scaled_mm (its CPU kernel too, which is how tests check the emulation)
  kEmulated,   // dequantize to float32, float32 matmul, cast to the result dtype
};
const char* to_string(Fp8MatmulKernel kernel);  // "auto", "scaled_mm", "emulated"
// The names above; anything else raises c10::ValueError listing them.
Fp8MatmulKernel parse_fp8_matmul_kernel(std::string_view name);
// What kAuto resolves to on `device`: kScaledMm when its DeviceInfo reports FP8 matrix units
// (NVIDIA sm_89+). AMD MI300's units take the fnuz FP8 formats rather than the OCP ones quantized
// to here, so ROCm devices emulate. Asked of the backend layer once per device and cached.
Fp8MatmulKernel resolve_fp8_matmul_kernel(Fp8MatmulKernel kernel, c10::Device device);

// a @ b for float8 a [M, K] and b [K, N] (any strides, any mix of e4m3/e5m2 except e5m2 x e5m2,
// which _scaled_mm does not support), with the scale inverses of each, as `out_dtype`.
// For kScaledMm the operands are laid out as _scaled_mm requires (a row-major, b column-major)
// and K and N are zero-padded to multiples of 16, which changes no value of the result.
// An empty M, K or N gives [M, N] zeros without calling a kernel.
at::Tensor fp8_matmul(const at::Tensor& a, const at::Tensor& a_scale_inverse, const at::Tensor& b,
                      const at::Tensor& b_scale_inverse, c10::ScalarType out_dtype,
                      Fp8MatmulKernel kernel = Fp8MatmulKernel::kAuto);

// The same product written into `out` ([M, N] on a's device, in out's dtype; c10::ValueError
// otherwise). The kernel writes `out` itself where it can (a contiguous float32/bf16/fp16 `out`
// and N a multiple of 16 for _scaled_mm, float32 for the emulation); otherwise the product is
// copied in.
void fp8_matmul_into(at::Tensor out, const at::Tensor& a, const at::Tensor& a_scale_inverse, const at::Tensor& b,
                     const at::Tensor& b_scale_inverse, Fp8MatmulKernel kernel = Fp8MatmulKernel::kAuto);

}  // namespace torchbridge::amp
