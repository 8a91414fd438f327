// Delayed-scaling quantization and the FP8 matmul (include/torchbridge/amp/fp8.h).
#include <torchbridge/amp/fp8.h>
#include <torchbridge/device_info.h>
#include <torchbridge/recomputation.h>
#include <torchbridge/registry.h>

#include <ATen/TensorOperators.h>
#include <ATen/ops/_scaled_mm.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/roll.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchbridge::amp {
namespace {

// The FP8 ops compute in the dtypes they are given; a surrounding autocast must not recast them
// (it would turn the float32 emulation matmul into a bf16 one).
using NoAutocast = c10::impl::ExcludeDispatchKeyGuard;

void check_scale_inverse(const at::Tensor& scale_inverse, const char* which) {
  TORCH_CHECK_VALUE(scale_inverse.defined() && scale_inverse.numel() == 1 &&
                        scale_inverse.scalar_type() == at::kFloat,
                    "fp8_matmul: ", which, " must be a float32 tensor with one element, got ",
                    scale_inverse.defined() ? std::string(c10::toString(scale_inverse.scalar_type())) +
                                                  " with " + std::to_string(scale_inverse.numel()) + " elements"
                                            : std::string("an undefined tensor"));
}

bool is_fp8(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat8_e4m3fn || t.scalar_type() == at::kFloat8_e5m2;
}

int64_t round_up_16(int64_t n) { return (n + 15) / 16 * 16; }

// `t` [rows', cols'] zero-extended to [rows, cols]; zeros add nothing to a matmul's sums.
at::Tensor zero_padded(const at::Tensor& t, int64_t rows, int64_t cols) {
  if (t.size(0) == rows && t.size(1) == cols) return t;
  at::Tensor padded = at::zeros({rows, cols}, t.options());
  padded.narrow(0, 0, t.size(0)).narrow(1, 0, t.size(1)).copy_(t);
  return padded;
}

bool scaled_mm_writes(c10::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
}

// _scaled_mm's layout contract: the first operand row-major, the second column-major; K and N
// zero-padded to multiples of 16.
std::pair<at::Tensor, at::Tensor> scaled_mm_operands(const at::Tensor& a, const at::Tensor& b) {
  const int64_t m = a.size(0), k16 = round_up_16(a.size(1)), n16 = round_up_16(b.size(1));
  return {zero_padded(a, m, k16).contiguous(), zero_padded(b, k16, n16).t().contiguous().t()};
}

at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& a_scale_inverse, const at::Tensor& b,
                     const at::Tensor& b_scale_inverse, c10::ScalarType out_dtype) {
  const auto [lhs, rhs] = scaled_mm_operands(a, b);
  const c10::ScalarType written = scaled_mm_writes(out_dtype) ? out_dtype : at::kFloat;
  at::Tensor product = at::_scaled_mm(lhs, rhs, a_scale_inverse, b_scale_inverse, std::nullopt, std::nullopt, written);
  const int64_t n = b.size(1);
  if (rhs.size(1) != n) product = product.narrow(1, 0, n).contiguous();
  return product.to(out_dtype);
}

// The emulation's operands: dequantized to float32, for a float32 matmul.
std::pair<at::Tensor, at::Tensor> emulated_operands(const at::Tensor& a, const at::Tensor& a_scale_inverse,
                                                    const at::Tensor& b, const at::Tensor& b_scale_inverse) {
  return {a.to(at::kFloat) * a_scale_inverse, b.to(at::kFloat) * b_scale_inverse};
}

void check_matmul_operands(const at::Tensor& a, const at::Tensor& a_scale_inverse, const at::Tensor& b,
                           const at::Tensor& b_scale_inverse) {
  TORCH_CHECK_VALUE(a.defined() && b.defined() && is_fp8(a) && is_fp8(b),
                    "fp8_matmul: both operands must be float8_e4m3fn or float8_e5m2 tensors, got ",
                    a.defined() ? c10::toString(a.scalar_type()) : "undefined", " and ",
                    b.defined() ? c10::toString(b.scalar_type()) : "undefined");
  TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
                    "fp8_matmul: expected a [M, K] and b [K, N], got ", a.sizes(), " and ", b.sizes());
  TORCH_CHECK_VALUE(!(a.scalar_type() == at::kFloat8_e5m2 && b.scalar_type() == at::kFloat8_e5m2),
                    "fp8_matmul: e5m2 x e5m2 is not supported by _scaled_mm; quantize one operand as e4m3");
  check_scale_inverse(a_scale_inverse, "a_scale_inverse");
  check_scale_inverse(b_scale_inverse, "b_scale_inverse");
}

// No matmul kernel is asked to take an empty operand: [M, 0] @ [0, N] sums nothing, so it is zeros.
bool has_empty_dimension(const at::Tensor& a, const at::Tensor& b) {
  return a.size(0) == 0 || a.size(1) == 0 || b.size(1) == 0;
}

// "Float of shape [2, 3] on cpu", for error messages.
std::string describe(const at::Tensor& t) {
  return t.defined() ? c10::str(t.scalar_type(), " of shape ", t.sizes(), " on ", t.device()) : "an undefined tensor";
}

// max |x| over the input, as float32: max(|min x|, |max x|). aminmax reads the input once in its
// own dtype (the max of bf16 or fp16 values is one of them, so nothing is rounded) and propagates
// NaN as abs().amax() would, without the float32 copy and the |x| tensor that those write.
at::Tensor absolute_max(const at::Tensor& values) {
  const auto [smallest, largest] = at::aminmax(values);
  return at::maximum(smallest.abs(), largest.abs()).to(at::kFloat);
}

// Steps 1 and 2 of quantize_delayed's contract: updates the state and returns the scale to use now
// (the state's). An empty input has no amax: the state stays as it is.
at::Tensor update_state(const at::Tensor& values, Fp8Format format, const DelayedScalingOptions& options,
                        Fp8ScalingState& state) {
  if (values.numel() > 0) {
    const at::Tensor amax = absolute_max(values);
    const at::Tensor history_max = state.amax_history.amax();
    const at::Tensor amax_for_scale = at::where(history_max > 0, history_max, amax);
    // fp8_max / (amax * 2^margin) as one IEEE division (a reciprocal-then-multiply rounds twice).
    const at::Tensor candidate = at::ones_like(amax_for_scale)
                                     .mul_(fp8_max(format))
                                     .div_(amax_for_scale * std::ldexp(1.0, static_cast<int>(options.margin)));
    // A zero, infinite or NaN amax keeps the previous scale. An inf amax gives a finite candidate,
    // 0 (448 / inf), and so does amax * 2^margin overflowing: the first step's inf set the scale to
    // 0, and every output became NaN. So the candidate must be finite and positive.
    const at::Tensor usable = (candidate > 0).logical_and(candidate.isfinite());
    state.scale.copy_(at::where(usable, candidate, state.scale));

    state.amax_history.copy_(at::roll(state.amax_history, 1));
    state.amax_history.select(0, 0).copy_(at::where(amax.isfinite(), amax, at::zeros_like(amax)));
  }
  return state.scale;
}

// x * scale clamped to the format's range, in float32, ready for the cast to float8.
at::Tensor scale_and_clamp(const at::Tensor& values, const at::Tensor& scale, Fp8Format format) {
  // One float32 temporary, scaled and clamped in place: a float32 input is multiplied into a new
  // tensor, any other is widened first. Either way the product is float32's, as the cast needs.
  at::Tensor scaled = values.scalar_type() == at::kFloat ? values * scale : values.to(at::kFloat).mul_(scale);
  return scaled.clamp_(-fp8_max(format), fp8_max(format));
}

// Checks the arguments, then updates the state, or, while activation checkpointing recomputes the
// layer, takes the scale its forward pass used and leaves the state alone (recomputation.h).
// Returns the scaled values and the scale they were scaled by.
std::pair<at::Tensor, at::Tensor> scale_delayed(const at::Tensor& input, Fp8Format format,
                                                const DelayedScalingOptions& options, Fp8ScalingState& state) {
  options.validate();
  TORCH_CHECK_VALUE(state.amax_history.defined() && state.amax_history.dim() == 1 &&
                        state.amax_history.size(0) == options.amax_history_length,
                    "fp8 scaling state: the amax history must have ", options.amax_history_length,
                    " entries (amax_history_length), got ",
                    state.amax_history.defined() ? state.amax_history.sizes().vec() : std::vector<int64_t>{});
  TORCH_CHECK_VALUE(input.is_floating_point() && !is_fp8(input),
                    "quantize_delayed: the input must be a float32/bf16/fp16 tensor, got ", input.scalar_type());
  const at::Tensor values = input.detach();
  const void* const state_key = state.amax_history.unsafeGetTensorImpl();
  std::optional<at::Tensor> scale = recomputation::replay(state_key);
  if (!scale) scale = update_state(values, format, options, state);
  recomputation::record(state_key, *scale);  // for regions nested in the one recomputed, too
  return {scale_and_clamp(values, *scale, format), *scale};
}

}  // namespace

c10::ScalarType fp8_scalar_type(Fp8Format format) {
  return format == Fp8Format::kE4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

double fp8_max(Fp8Format format) { return format == Fp8Format::kE4M3 ? 448.0 : 57344.0; }

const char* to_string(Fp8Format format) { return format == Fp8Format::kE4M3 ? "e4m3" : "e5m2"; }

Fp8Format parse_fp8_format(std::string_view name) {
  if (name == "e4m3") return Fp8Format::kE4M3;
  if (name == "e5m2") return Fp8Format::kE5M2;
  TORCH_CHECK_VALUE(false, "unknown fp8 format '", std::string(name), "': expected e4m3 or e5m2");
}

void DelayedScalingOptions::validate() const {
  TORCH_CHECK_VALUE(amax_history_length >= 1, "fp8 amax_history_length must be at least 1, got ",
                    amax_history_length);
  TORCH_CHECK_VALUE(margin >= 0 && margin <= 64,
                    "fp8 margin must be between 0 and 64 (scale = fp8_max / (amax * 2^margin)), got ", margin);
}

Fp8ScalingState Fp8ScalingState::create(int64_t amax_history_length, c10::Device device) {
  DelayedScalingOptions{amax_history_length, 0}.validate();
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  return {at::zeros({amax_history_length}, options), at::ones({}, options)};
}

Fp8Tensor quantize_delayed(const at::Tensor& input, Fp8Format format, const DelayedScalingOptions& options,
                           Fp8ScalingState& state) {
  NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  auto [scaled, scale] = scale_delayed(input, format, options, state);
  return {scaled.to(fp8_scalar_type(format)), scale.reciprocal()};
}

at::Tensor quantize_delayed_into(const at::Tensor& data, const at::Tensor& input, Fp8Format format,
                                 const DelayedScalingOptions& options, Fp8ScalingState& state) {
  TORCH_CHECK_VALUE(data.defined() && data.scalar_type() == fp8_scalar_type(format) && data.sizes() == input.sizes() &&
                        data.device() == input.device(),
                    "quantize_delayed_into: data must be a ", fp8_scalar_type(format), " tensor of the input's shape ",
                    input.sizes(), " on ", input.device(), ", got ", describe(data));
  NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  // copy_ converts float32 to float8 exactly as .to() does, straight into the caller's tensor.
  auto [scaled, scale] = scale_delayed(input, format, options, state);
  data.copy_(scaled);
  return scale.reciprocal();
}

const char* to_string(Fp8MatmulKernel kernel) {
  switch (kernel) {
    case Fp8MatmulKernel::kAuto:
      return "auto";
    case Fp8MatmulKernel::kScaledMm:
      return "scaled_mm";
    case Fp8MatmulKernel::kEmulated:
      return "emulated";
  }
  return "unknown";
}

Fp8MatmulKernel parse_fp8_matmul_kernel(std::string_view name) {
  for (auto kernel : {Fp8MatmulKernel::kAuto, Fp8MatmulKernel::kScaledMm, Fp8MatmulKernel::kEmulated}) {
    if (name == to_string(kernel)) return kernel;
  }
  TORCH_CHECK_VALUE(false, "unknown fp8 matmul kernel '", std::string(name), "': expected auto, scaled_mm or emulated");
}

Fp8MatmulKernel resolve_fp8_matmul_kernel(Fp8MatmulKernel kernel, c10::Device device) {
  if (kernel != Fp8MatmulKernel::kAuto) return kernel;
  if (device.is_cpu()) return Fp8MatmulKernel::kEmulated;  // no CPU has FP8 matrix units
  static std::mutex mutex;
  static std::map<std::pair<c10::DeviceType, int>, bool> has_fp8_units;
  const std::pair<c10::DeviceType, int> key{device.type(), device.has_index() ? device.index() : 0};
  std::lock_guard<std::mutex> lock(mutex);
  auto found = has_fp8_units.find(key);
  if (found == has_fp8_units.end()) {
    bool units = false;
    for (const BackendEntry& entry : BackendRegistry::instance().entries()) {
      if (entry.backend->device_type() == device.type() && entry.backend->availability().available()) {
        const DeviceInfo info = entry.backend->info(key.second);
        // ROCm's FP8 units on MI300 take the fnuz formats (float8_e4m3fnuz), not the OCP ones this
        // recipe quantizes to; until an AMD GPU can test that path, ROCm devices emulate.
        units = info.features.fp8 && info.backend != "rocm";
        break;
      }
    }
    found = has_fp8_units.emplace(key, units).first;
  }
  return found->second ? Fp8MatmulKernel::kScaledMm : Fp8MatmulKernel::kEmulated;
}

at::Tensor fp8_matmul(const at::Tensor& a, const at::Tensor& a_scale_inverse, const at::Tensor& b,
                      const at::Tensor& b_scale_inverse, c10::ScalarType out_dtype, Fp8MatmulKernel kernel) {
  check_matmul_operands(a, a_scale_inverse, b, b_scale_inverse);
  // An integer or bool product is the float one truncated (1.74 became 1, 5.75 became true).
  TORCH_CHECK_VALUE(c10::isFloatingType(out_dtype), "fp8_matmul: out_dtype must be a floating-point dtype, got ",
                    c10::toString(out_dtype));
  NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  if (has_empty_dimension(a, b)) return at::zeros({a.size(0), b.size(1)}, a.options().dtype(out_dtype));
  const at::Tensor a_inverse = a_scale_inverse.reshape({}), b_inverse = b_scale_inverse.reshape({});
  if (resolve_fp8_matmul_kernel(kernel, a.device()) == Fp8MatmulKernel::kScaledMm) {
    return scaled_mm(a, a_inverse, b, b_inverse, out_dtype);
  }
  const auto [lhs, rhs] = emulated_operands(a, a_inverse, b, b_inverse);
  return at::mm(lhs, rhs).to(out_dtype);
}

void fp8_matmul_into(at::Tensor out, const at::Tensor& a, const at::Tensor& a_scale_inverse,
                     const at::Tensor& b, const at::Tensor& b_scale_inverse, Fp8MatmulKernel kernel) {
  check_matmul_operands(a, a_scale_inverse, b, b_scale_inverse);
  TORCH_CHECK_VALUE(out.defined() && out.dim() == 2 && out.size(0) == a.size(0) && out.size(1) == b.size(1) &&
                        out.device() == a.device(),
                    "fp8_matmul_into: out must be a [", a.size(0), ", ", b.size(1), "] tensor on ", a.device(),
                    ", got ", describe(out));
  TORCH_CHECK_VALUE(c10::isFloatingType(out.scalar_type()),
                    "fp8_matmul_into: out must be a floating-point tensor, got ", c10::toString(out.scalar_type()));
  NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  if (has_empty_dimension(a, b)) {
    out.zero_();
    return;
  }
  const at::Tensor a_inverse = a_scale_inverse.reshape({}), b_inverse = b_scale_inverse.reshape({});
  const c10::ScalarType out_dtype = out.scalar_type();
  // Where the kernel can write `out` itself, it does; otherwise the product is copied in.
  if (resolve_fp8_matmul_kernel(kernel, a.device()) == Fp8MatmulKernel::kScaledMm) {
    if (out.is_contiguous() && scaled_mm_writes(out_dtype) && b.size(1) % 16 == 0) {
      const auto [lhs, rhs] = scaled_mm_operands(a, b);
      at::_scaled_mm_out(out, lhs, rhs, a_inverse, b_inverse, std::nullopt, std::nullopt, out_dtype);
    } else {
      out.copy_(scaled_mm(a, a_inverse, b, b_inverse, out_dtype));
    }
  } else {
    const auto [lhs, rhs] = emulated_operands(a, a_inverse, b, b_inverse);
    if (out_dtype == at::kFloat) {
      at::mm_out(out, lhs, rhs);
    } else {
      out.copy_(at::mm(lhs, rhs));
    }
  }
}

}  // namespace torchbridge::amp
