#pragma once
// Per-device random number generators for SDK devices. Random operators run through the CPU
// fallback, so each device generator owns a CPU generator (mt19937 state) that the fallback hands
// to the CPU kernels: seeds, states and sequences are per device and reproducible.

#include <ATen/core/Generator.h>

namespace torchbridge::sdk {

void init_generators(int device_count);
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
// The CPU generator carrying the state of an SDK device generator.
at::Generator cpu_generator_of(const at::Generator& device_generator);

}  // namespace torchbridge::sdk
