#include <torchbridge/redirect.h>

#include <torchbridge/registry.h>

#include <c10/util/Exception.h>

#include <memory>
#include <vector>

namespace torchbridge {
namespace {

// The available backend serving torch device type `type`, if any.
std::shared_ptr<Backend> available_backend_for(c10::DeviceType type) {
  for (const auto& entry : BackendRegistry::instance().entries()) {
    if (entry.backend->device_type() == type && entry.backend->is_available()) return entry.backend;
  }
  return nullptr;
}

c10::Device on(const Backend& backend, int requested_index, DeviceResolution& out) {
  if (backend.device_type() == c10::kCPU) return c10::Device(c10::kCPU);
  if (requested_index < 0) return c10::Device(backend.device_type());
  const int count = backend.device_count();
  out.index_wrapped = requested_index >= count;
  return c10::Device(backend.device_type(), static_cast<c10::DeviceIndex>(requested_index % count));
}

}  // namespace

DeviceResolution resolve_device(const std::string& requested, const std::string& target_backend,
                                RedirectTarget target_choice) {
  DeviceResolution out;
  if (requested == "cpu:-1") {
    out.redirected = true;
    return out;  // forced CPU
  }
  c10::Device parsed(c10::kCPU);
  try {
    parsed = c10::Device(requested);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "cannot redirect device '", requested, "': ", e.msg());
  }
  // Only accelerator requests move: the CPU, and the tensor-less meta and lazy devices that torch
  // itself uses (torch.compile traces on meta tensors), stay what they are.
  if (parsed.is_cpu() || parsed.is_meta() || parsed.type() == c10::DeviceType::Lazy) {
    out.device = parsed;
    return out;
  }
  const int index = parsed.has_index() ? parsed.index() : -1;
  if (target_choice == RedirectTarget::kDetected) {
    if (const auto native = available_backend_for(parsed.type())) {
      out.device = on(*native, index, out);
      out.redirected = out.index_wrapped;
      return out;
    }
  }
  const auto target = create_backend(target_backend);  // raises for unknown/unavailable targets
  out.device = on(*target, index, out);
  out.redirected = out.device.type() != parsed.type() || out.index_wrapped;
  return out;
}

}  // namespace torchbridge
