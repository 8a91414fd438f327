#pragma once
// Operator, fallback and autocast registrations for the SDK device, done when a runtime registers
// (never at library load, so loading libtorchbridge never claims PrivateUse1). Internal.

namespace torchbridge::sdk {
void register_native_ops();
void register_convolution();
void register_batch_norm();
void register_rnn_cells();
void register_record_stream();
void register_cpu_fallback();
void register_autocast();
}  // namespace torchbridge::sdk
