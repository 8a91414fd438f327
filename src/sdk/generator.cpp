#include "sdk/generator.h"

#include "sdk/runtime_handle.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/DispatchKeySet.h>

#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

class SdkGenerator final : public c10::GeneratorImpl {
 public:
  SdkGenerator(c10::DeviceIndex device, at::Generator cpu)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(std::move(cpu)) {}

  void set_current_seed(uint64_t seed) override { cpu_.set_current_seed(seed); }
  // Offsets belong to counter-based (Philox) generators such as CUDA's; this one is an mt19937
  // state, whose position is all in get_state. torch pickles and deep-copies a non-CPU generator
  // as (seed, get_offset(), state) and restores set_offset before set_state, so the offset is 0
  // and setting 0 changes nothing; another offset cannot be honoured (the CPU generator's own
  // refusal would name "CPU Generator", not this device).
  void set_offset(uint64_t offset) override {
    TORCH_CHECK_NOT_IMPLEMENTED(offset == 0, "a '", runtime().name(), "' generator has no offset to set to ", offset,
                                ": random operators run through the CPU fallback from an mt19937 state, as torch's "
                                "CPU generator does; save and restore its position with get_state() and set_state()");
  }
  uint64_t get_offset() const override { return 0; }
  uint64_t current_seed() const override { return cpu_.current_seed(); }
  uint64_t seed() override { return cpu_.seed(); }
  void set_state(const c10::TensorImpl& state) override { cpu_.unsafeGetGeneratorImpl()->set_state(state); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }
  const at::Generator& cpu() const { return cpu_; }

 private:
  SdkGenerator* clone_impl() const override { return new SdkGenerator(device().index(), cpu_.clone()); }
  at::Generator cpu_;
};

std::vector<at::Generator> defaults;

}  // namespace

void init_generators(int device_count) {
  for (int d = 0; d < device_count; ++d) defaults.push_back(new_generator(static_cast<c10::DeviceIndex>(d)));
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  if (device < 0) {
    int32_t current = 0;
    TB_CALL(get_device, &current);
    device = static_cast<c10::DeviceIndex>(current);
  }
  TORCH_CHECK_INDEX(static_cast<size_t>(device) < defaults.size(), "device index ", int(device),
                    " is out of range for '", runtime().name(), "' (", defaults.size(), " devices)");
  return defaults[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  return at::make_generator<SdkGenerator>(device, at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val));
}

at::Generator cpu_generator_of(const at::Generator& device_generator) {
  auto* impl = dynamic_cast<SdkGenerator*>(device_generator.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "generator on ", device_generator.device(), " is not an SDK device generator");
  return impl->cpu();
}

}  // namespace torchbridge::sdk
