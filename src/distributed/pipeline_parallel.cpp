#include <torchbridge/distributed/pipeline_parallel.h>


#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::distributed {
namespace {

constexpr int64_t kMaxDims = 8;

// Every message is a header (dimensions, dtype, sizes) then the tensor, each with a tag of its
// own: micro-batch m's activation travels on tags 4m and 4m+1, its gradient on 4m+2 and 4m+3,
// so no two messages between two stages can be confused, whatever the schedule's order.
int header_tag(int64_t micro_batch, bool gradient) { return static_cast<int>(4 * micro_batch + (gradient ? 2 : 0)); }

// Point-to-point transfers of one training step. Sends are not waited for when made: with the
// 1F1B schedule, neighbours send to each other at the same time, and waiting would deadlock.
// They are waited for at the end of the step; their tensors are kept alive until then.
class Transfers {
 public:
  Transfers(ProcessGroup& group, int stage) : group_(group), stage_(stage) {}

  void send(const at::Tensor& tensor, int to, int tag, const char* what) {
    TORCH_CHECK_VALUE(tensor.dim() <= kMaxDims, "Pipeline: stage ", stage_, " sends a ", tensor.dim(),
                      "-dimensional ", what, "; at most ", kMaxDims, " dimensions travel");
    at::Tensor header = at::zeros({kMaxDims + 2}, at::kLong);
    header[0] = tensor.dim();
    header[1] = static_cast<int64_t>(tensor.scalar_type());
    for (int64_t d = 0; d < tensor.dim(); ++d) header[d + 2] = tensor.size(d);
    post(header, to, tag, what);
    post(tensor.detach().to(at::kCPU).contiguous(), to, tag + 1, what);
  }

  // On the CPU, as it arrived; the caller moves it to its device.
  at::Tensor receive(int from, int tag, const char* what) {
    at::Tensor header = at::empty({kMaxDims + 2}, at::kLong);
    wait_for_receive(header, from, tag, what);
    std::vector<int64_t> sizes;
    for (int64_t d = 0; d < header[0].item<int64_t>(); ++d) sizes.push_back(header[d + 2].item<int64_t>());
    at::Tensor tensor = at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(header[1].item<int64_t>())));
    wait_for_receive(tensor, from, tag + 1, what);
    return tensor;
  }

  void finish() {
    run("completing its sends", [&] {
      for (auto& work : sends_) work->wait();
    });
    sends_.clear();
    kept_.clear();
  }

 private:
  template <typename Step>
  void run(const std::string& what, const Step& step) {
    try {
      step();
    } catch (const std::exception& e) {
      group_.raise_failure("Pipeline stage " + std::to_string(stage_) + " " + what, e);
    }
  }

  void post(const at::Tensor& tensor, int to, int tag, const char* what) {
    kept_.push_back(tensor);
    std::vector<at::Tensor> tensors{tensor};
    run(std::string("sending its ") + what + " to stage " + std::to_string(to),
        [&] { sends_.push_back(group_.native()->send(tensors, to, tag)); });
  }

  void wait_for_receive(at::Tensor& tensor, int from, int tag, const char* what) {
    std::vector<at::Tensor> tensors{tensor};
    run(std::string("receiving the ") + what + " from stage " + std::to_string(from),
        [&] { group_.native()->recv(tensors, from, tag)->wait(); });
  }

  ProcessGroup& group_;
  int stage_;
  std::vector<c10::intrusive_ptr<c10d::Work>> sends_;
  std::vector<at::Tensor> kept_;
};

}  // namespace

Pipeline::Pipeline(Stage stage, std::shared_ptr<ProcessGroup> group, PipelineSchedule schedule, c10::Device device)
    : stage_(std::move(stage)), group_(std::move(group)), schedule_(schedule), device_(device) {
  TORCH_CHECK_VALUE(group_ != nullptr, "Pipeline needs a process group (torchbridge::distributed::init())");
  TORCH_CHECK_VALUE(static_cast<bool>(stage_), "Pipeline needs this rank's stage (a function of one tensor)");
  TORCH_CHECK_VALUE(device_.is_cpu() || device_.is_privateuseone(), "Pipeline runs on Gloo: the CPU, or an SDK ",
                    "device through host memory; not ", device_, " (pipeline parallel over NCCL is not built)");
}

int Pipeline::stage_index() const { return group_->rank(); }
int Pipeline::stage_count() const { return group_->world_size(); }

double Pipeline::train_step(const at::Tensor& inputs, const at::Tensor& targets, int64_t micro_batches,
                            const LossFunction& loss) {
  const int stage = stage_index(), stages = stage_count();
  const bool first = stage == 0, last = stage == stages - 1;
  TORCH_CHECK_VALUE(micro_batches >= 1, "Pipeline: micro_batches must be at least 1, got ", micro_batches);
  const auto slices = [&](const at::Tensor& batch, const char* name) {
    TORCH_CHECK_VALUE(batch.defined() && batch.dim() >= 1, "Pipeline stage ", stage, " needs the batch's ", name);
    TORCH_CHECK_VALUE(batch.device() == device_, "Pipeline stage ", stage, " computes on ", device_,
                      " but the batch's ", name, " are on ", batch.device());
    TORCH_CHECK_VALUE(batch.size(0) % micro_batches == 0, "Pipeline: the batch's ", batch.size(0), " ", name,
                      " rows do not split into ", micro_batches, " equal micro-batches");
    return batch.chunk(micro_batches, 0);
  };
  const std::vector<at::Tensor> input_slices = first ? slices(inputs, "inputs") : std::vector<at::Tensor>();
  const std::vector<at::Tensor> target_slices = last ? slices(targets, "targets") : std::vector<at::Tensor>();
  TORCH_CHECK_VALUE(!last || static_cast<bool>(loss), "Pipeline: the last stage needs a loss function");

  Transfers transfers(*group_, stage);
  // Per micro-batch: what this stage received (a leaf, to read its gradient) and produced.
  std::vector<at::Tensor> received(static_cast<size_t>(micro_batches)), produced(received.size());
  double total_loss = 0;
  int64_t held = 0;
  peak_held_ = 0;

  const auto forward = [&](int64_t m) {
    at::Tensor x = first ? input_slices[static_cast<size_t>(m)]
                         : transfers.receive(stage - 1, header_tag(m, false), "activation").to(device_);
    // A gradient flows back through floating-point activations only: token ids (an integer
    // tensor) cannot require one, and the stage before them has nothing to differentiate.
    if (!first && (at::isFloatingType(x.scalar_type()) || at::isComplexType(x.scalar_type()))) x.requires_grad_();
    at::Tensor y = stage_(x);
    if (last) {
      const at::Tensor value = loss(y, target_slices[static_cast<size_t>(m)]);
      TORCH_CHECK_VALUE(value.numel() == 1, "Pipeline: the loss function must return a scalar, got shape ",
                        value.sizes());
      total_loss += value.item<double>();
      y = value / static_cast<double>(micro_batches);  // the whole batch's mean loss, summed over micro-batches
    } else {
      transfers.send(y, stage + 1, header_tag(m, false), "activation");
    }
    received[static_cast<size_t>(m)] = x;
    produced[static_cast<size_t>(m)] = y;
    peak_held_ = std::max(peak_held_, ++held);
  };
  const auto backward = [&](int64_t m) {
    auto& x = received[static_cast<size_t>(m)];
    auto& y = produced[static_cast<size_t>(m)];
    // A stage whose output has no graph (frozen parameters on an input that needs no gradient,
    // or an integer output) has nothing to run backward through, as torch.distributed.pipelining
    // skips it; the next stage's gradient is still received, to keep the exchange in step.
    const at::Tensor output_gradient =
        last ? at::Tensor() : transfers.receive(stage + 1, header_tag(m, true), "gradient").to(device_);
    if (y.requires_grad()) {
      if (last) {
        torch::autograd::backward({y});
      } else {
        torch::autograd::backward({y}, {output_gradient});
      }
    }
    // Zeros where no gradient reached the input (an integer input, or one the stage ignores): the
    // stage before waits for a tensor of its output's shape.
    if (!first) transfers.send(x.grad().defined() ? x.grad() : at::zeros_like(x), stage - 1, header_tag(m, true), "gradient");
    x = at::Tensor();  // this micro-batch's activations are no longer needed
    y = at::Tensor();
    --held;
  };

  if (schedule_ == PipelineSchedule::gpipe) {
    for (int64_t m = 0; m < micro_batches; ++m) forward(m);
    for (int64_t m = 0; m < micro_batches; ++m) backward(m);
  } else {
    const int64_t warm_up = std::min<int64_t>(stages - stage - 1, micro_batches);
    for (int64_t m = 0; m < warm_up; ++m) forward(m);
    for (int64_t m = 0; m < micro_batches - warm_up; ++m) {
      forward(warm_up + m);
      backward(m);
    }
    for (int64_t m = micro_batches - warm_up; m < micro_batches; ++m) backward(m);
  }
  transfers.finish();

  at::Tensor mean_loss = at::full({1}, total_loss / static_cast<double>(micro_batches), at::kDouble);
  group_->broadcast(mean_loss, stages - 1);
  return mean_loss.item<double>();
}

}  // namespace torchbridge::distributed
