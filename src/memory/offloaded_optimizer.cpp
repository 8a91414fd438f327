// Optimizer-state offload (offloaded_optimizer.h): host optimizers over pinned master copies,
// gradients down and parameters up on a side stream, one bucket at a time.
#include <torchbridge/memory/offloaded_optimizer.h>
#include <torchbridge/pinned_host.h>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::memory {

namespace {

// What says a device parameter was written since its master copy was taken: its version counter
// (bumped by every in-place write to the parameter itself, e.g. Module::load_state_dict's copy_)
// and its storage (new data, `p.data = t`, Module::to). The storage is held weakly so a new one
// cannot take the old one's address. Writes through `p.data` (a tensor with its own version
// counter, as torch's autograd documents) change neither and are not seen.
struct ParameterIdentity {
  int64_t version;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t storage_offset;

  explicit ParameterIdentity(const at::Tensor& p)
      : version(p._version()), storage(p.storage().getWeakStorageImpl()), storage_offset(p.storage_offset()) {}
  bool matches(const at::Tensor& p) const {
    return p._version() == version && storage._unsafe_get_target() == p.storage().unsafeGetStorageImpl() &&
           p.storage_offset() == storage_offset;
  }
};

}  // namespace

struct OffloadedOptimizer::Bucket {
  std::vector<size_t> indices;          // into parameters_
  std::vector<at::Tensor> host_params;  // pinned float32 master copies, what the host optimizer updates
  std::vector<at::Tensor> host_grads;   // pinned staging for the gradients
  // Each device parameter as it was when its master last matched it (see ParameterIdentity).
  std::vector<ParameterIdentity> synced;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::optional<c10::Event> gradients_arrived;
};

namespace {

c10::Device device_of(const std::vector<at::Tensor>& parameters) {
  TORCH_CHECK_VALUE(!parameters.empty(), "OffloadedOptimizer: no parameters were given");
  const c10::Device device = parameters[0].defined() ? parameters[0].device() : c10::Device(c10::kCPU);
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& p = parameters[i];
    TORCH_CHECK_VALUE(p.defined(), "OffloadedOptimizer: parameter ", i, " is an undefined tensor");
    TORCH_CHECK_VALUE(!p.device().is_cpu(), "OffloadedOptimizer: parameter ", i, " is on the CPU; optimizer-state "
                      "offload moves state from an accelerator to host memory, and this state is there already "
                      "(use the optimizer directly)");
    TORCH_CHECK_VALUE(p.device() == device, "OffloadedOptimizer: parameter ", i, " is on ", p.device(),
                      ", parameter 0 on ", device, "; all parameters must be on one device");
    TORCH_CHECK_VALUE(p.scalar_type() == at::kFloat, "OffloadedOptimizer: parameter ", i, " is ",
                      c10::toString(p.scalar_type()), "; float32 parameters are supported (the host copies are the "
                      "float32 masters)");
  }
  // Offload runs on the process's accelerator (at::getAccelerator): the side stream, events and
  // pinned host memory of its devices are the combination built and tested.
  const std::optional<c10::DeviceType> accelerator = at::getAccelerator(/*checked=*/false);
  const std::string name =
      accelerator ? c10::DeviceTypeName(*accelerator, /*lower_case=*/true) : std::string("none");
  TORCH_CHECK_VALUE(accelerator == device.type(), "OffloadedOptimizer: the parameters are on ", device,
                    ", but this process's accelerator is ", name, ", and offload runs on the accelerator's devices "
                    "only (its side stream, events and pinned host memory); offload from ", name,
                    "'s devices, or keep the optimizer on ", device);
  return device;
}

void check_still_the_same_kind(size_t index, const at::Tensor& parameter, const at::Tensor& master,
                               c10::Device device) {
  TORCH_CHECK_VALUE(parameter.device() == device && parameter.scalar_type() == at::kFloat &&
                        parameter.sizes() == master.sizes(),
                    "OffloadedOptimizer: parameter ", index, " is now ", c10::toString(parameter.scalar_type()), " ",
                    parameter.sizes(), " on ", parameter.device(), ", but was ", c10::toString(at::kFloat), " ",
                    master.sizes(), " on ", device,
                    " when the optimizer was built; its master copy and state have that shape, so build a new "
                    "optimizer for the changed parameters");
}

}  // namespace

OffloadedOptimizer::OffloadedOptimizer(std::vector<at::Tensor> parameters, Factory factory, OffloadOptions options)
    : parameters_(std::move(parameters)), device_(device_of(parameters_)) {
  TORCH_CHECK_VALUE(factory, "OffloadedOptimizer: no optimizer factory was given");
  TORCH_CHECK_VALUE(options.bucket_bytes > 0, "OffloadedOptimizer: bucket_bytes must be positive, got ",
                    options.bucket_bytes);
  int64_t filled = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (buckets_.empty() || filled >= options.bucket_bytes) {
      buckets_.push_back(std::make_unique<Bucket>());
      filled = 0;
    }
    Bucket& bucket = *buckets_.back();
    const at::Tensor& p = parameters_[i];
    at::Tensor master = pinned_host_like(p, device_.type());
    master.copy_(p.detach());
    bucket.indices.push_back(i);
    bucket.host_params.push_back(master);
    bucket.host_grads.push_back(pinned_host_like(p, device_.type()));
    bucket.synced.emplace_back(p);
    filled += p.numel() * static_cast<int64_t>(p.element_size());
  }
  for (auto& bucket : buckets_) {
    bucket->optimizer = factory(bucket->host_params);
    TORCH_CHECK_VALUE(bucket->optimizer, "OffloadedOptimizer: the factory returned no optimizer");
  }
}

OffloadedOptimizer::~OffloadedOptimizer() = default;

void OffloadedOptimizer::step() {
  const c10::impl::VirtualGuardImpl streams(device_.type());
  const c10::Stream compute = streams.getStream(device_);
  const c10::Stream side = streams.getStreamFromGlobalPool(device_);

  // Gradients down: every copy queued at once on the side stream, after the backward pass's work.
  // Parameters written since the last step (by index into parameters_): checked before anything is
  // queued, copied down below.
  std::vector<bool> written(parameters_.size(), false);
  for (auto& bucket : buckets_) {
    for (size_t k = 0; k < bucket->indices.size(); ++k) {
      const at::Tensor& parameter = parameters_[bucket->indices[k]];
      if (!bucket->synced[k].matches(parameter)) {
        check_still_the_same_kind(bucket->indices[k], parameter, bucket->host_params[k], device_);
        written[bucket->indices[k]] = true;
      }
    }
  }
  c10::Event backward_done(device_.type());
  backward_done.record(compute);
  backward_done.block(side);
  {
    c10::StreamGuard on_side(side);
    for (auto& bucket : buckets_) {
      for (size_t k = 0; k < bucket->indices.size(); ++k) {
        const at::Tensor& parameter = parameters_[bucket->indices[k]];
        if (written[bucket->indices[k]]) {
          bucket->host_params[k].copy_(parameter.detach(), /*non_blocking=*/true);
        }
        const at::Tensor& grad = parameter.grad();
        if (grad.defined()) bucket->host_grads[k].copy_(grad, /*non_blocking=*/true);
      }
      bucket->gradients_arrived.emplace(device_.type());
      bucket->gradients_arrived->record(side);
    }
  }

  // The CPU steps each bucket once its gradients are in, while later buckets are still copying,
  // and queues its parameters back up.
  torch::autograd::AutoGradMode no_grad(false);
  for (auto& bucket : buckets_) {
    bucket->gradients_arrived->synchronize();
    for (size_t k = 0; k < bucket->indices.size(); ++k) {
      const bool has_grad = parameters_[bucket->indices[k]].grad().defined();
      bucket->host_params[k].mutable_grad() = has_grad ? bucket->host_grads[k] : at::Tensor();
    }
    bucket->optimizer->step();
    c10::StreamGuard on_side(side);
    for (size_t k = 0; k < bucket->indices.size(); ++k) {
      at::Tensor& parameter = parameters_[bucket->indices[k]];
      parameter.copy_(bucket->host_params[k], /*non_blocking=*/true);
      bucket->synced[k] = ParameterIdentity(parameter);
    }
  }

  // The next forward pass waits for the uploads on the device, not on the CPU. The host buffers are
  // only written again after the next step's gradient copies, queued behind these uploads, arrive.
  c10::Event uploaded(device_.type());
  uploaded.record(side);
  uploaded.block(compute);
}

void OffloadedOptimizer::zero_grad(bool set_to_none) {
  for (at::Tensor& p : parameters_) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.mutable_grad() = at::Tensor();
      continue;
    }
    // As Python's torch.optim does: detach_() only a gradient with a graph. A view (of
    // DataParallel's buckets, with gradient_as_bucket_view) cannot be detached in place.
    at::Tensor& grad = p.mutable_grad();
    if (grad.grad_fn()) {
      grad.detach_();
    } else {
      grad.requires_grad_(false);
    }
    grad.zero_();
  }
}

std::pair<at::Tensor, torch::optim::Optimizer*> OffloadedOptimizer::host_side_of(size_t index) const {
  for (const auto& bucket : buckets_) {
    for (size_t k = 0; k < bucket->indices.size(); ++k) {
      if (bucket->indices[k] == index) return {bucket->host_params[k], bucket->optimizer.get()};
    }
  }
  C10_THROW_ERROR(IndexError, c10::str("OffloadedOptimizer: parameter ", index, " does not exist (",
                                       parameters_.size(), " parameters)"));
}

std::vector<torch::optim::Optimizer*> OffloadedOptimizer::host_optimizers() const {
  std::vector<torch::optim::Optimizer*> optimizers;
  for (const auto& bucket : buckets_) optimizers.push_back(bucket->optimizer.get());
  return optimizers;
}

}  // namespace torchbridge::memory
