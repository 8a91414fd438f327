#pragma once
// Operator, fallback and autocast registrations for the SDK device, done when a runtime registers
// (never at library load, so loading libtorchbridge never claims PrivateUse1). Internal.

namespace torchbridge::sdk {
void register_native_ops();
// add, sub, mul, div and their in-place forms: the CPU fallback without its boxed machinery.
void register_elementwise_fast_path();
// _copy_from and _copy_from_and_resize see conjugate/negative tensors as they are (copy.cpp).
void register_copy_math_bits();
void register_convolution();
void register_batch_norm();
// native_dropout drawing from the device's generator (dropout.cpp).
void register_dropout();
// _to_copy: a non_blocking copy to the CPU lands in memory pinned by the device (to_copy.cpp).
void register_to_copy();
void register_rnn_cells();
void register_record_stream();
void register_cpu_fallback();
// Sparse layouts: structure kernels plus the CPU fallback for the sparse dispatch keys (sparse.cpp).
void register_sparse();
// Quantized tensors: a clear error for every operator (quantized.cpp).
void register_quantized_refusal();
// Nested tensors of the strided layout: a clear error for every operator (nested.cpp).
void register_nested_refusal();
void register_autocast();
// Device events for torch's profiler in its PrivateUse1 fallback mode (profiler_stubs.cpp).
void register_profiler_stubs();
}  // namespace torchbridge::sdk
