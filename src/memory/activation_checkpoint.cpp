// Activation checkpointing (activation_checkpoint.h): the region's forward graph is read for the
// edges through which its backward leaves it, then replaced by one node that recomputes the region
// and runs its backward as a nested autograd call ending at those edges.
#include <torchbridge/memory/activation_checkpoint.h>

#include "forward_context.h"

#include <torchbridge/recomputation.h>

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/input_metadata.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <utility>

namespace torchbridge::memory {
namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

struct OutputMetadata {
  bool defined = false;
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::kCPU);
};

OutputMetadata metadata_of(const at::Tensor& tensor) {
  if (!tensor.defined()) return {};
  return {true, tensor.sizes().vec(), tensor.scalar_type(), tensor.device()};
}

std::string describe(const OutputMetadata& m) {
  if (!m.defined) return "an undefined tensor";
  std::ostringstream out;
  out << c10::toString(m.dtype) << " " << c10::IntArrayRef(m.sizes) << " on " << m.device;
  return out.str();
}

// The autograd nodes the region's forward pass created: made on this thread while the sequence
// counter ran from `begin` to `end`. Gradient accumulators of leaves are never part of a region.
struct RegionNodes {
  uint64_t thread_id;
  uint64_t begin;
  uint64_t end;

  bool contains(const Node* node) const {
    if (node->thread_id() != thread_id || node->sequence_nr() < begin || node->sequence_nr() >= end) return false;
    return dynamic_cast<const torch::autograd::AccumulateGrad*>(node) == nullptr;
  }
};

// torch 2.11 owns autograd nodes through std::shared_ptr, newer torch (2.13 on) through
// c10::intrusive_ptr; Edge::function names whichever this torch uses, and the node is made to match.
using NodePtr = decltype(Edge::function);
template <typename ConcreteNode, typename... Args>
NodePtr make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<Node>>) {
    return std::make_shared<ConcreteNode>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<ConcreteNode>(std::forward<Args>(args)...);
  }
}

// The edges through which gradients leave the region: from the outputs' gradient edges through
// every node of the region to the first edge that points outside it (an input's grad_fn, a
// parameter's accumulator, a captured tensor's grad_fn). Each appears once.
edge_list edges_leaving_region(const std::vector<at::Tensor>& outputs, const RegionNodes& region) {
  edge_list leaving;
  std::set<std::pair<const Node*, uint32_t>> seen_edges;
  std::unordered_set<const Node*> visited;
  std::vector<Node*> pending;
  auto consider = [&](const Edge& edge) {
    if (!edge.is_valid()) return;
    Node* node = edge.function.get();
    if (region.contains(node)) {
      if (visited.insert(node).second) pending.push_back(node);
    } else if (seen_edges.insert({node, edge.input_nr}).second) {
      leaving.push_back(edge);
    }
  };
  for (const at::Tensor& output : outputs) {
    if (output.defined() && output.requires_grad()) consider(torch::autograd::impl::gradient_edge(output));
  }
  while (!pending.empty()) {
    Node* node = pending.back();
    pending.pop_back();
    for (const Edge& edge : node->next_edges()) consider(edge);
  }
  return leaving;
}

// Where the recomputed region's backward delivers a gradient that leaves the region. The nested
// backward call would otherwise capture it at the outside node itself, and autograd runs the
// tensor hooks (register_hook, retain_grad) of a captured node before capturing; the outer
// backward then runs them a second time when it reaches that node, so a hook that scales a
// gradient scaled it twice. A sink has no hooks: what it captures is the raw gradient, and the
// outer pass alone runs the hooks, once, as it does without checkpointing. It copies the outside
// node's input metadata, so the engine validates and streams the gradient as it would for it.
class GradientSink : public Node {
 public:
  explicit GradientSink(Edge stands_for) : stands_for_(std::move(stands_for)) {
    input_metadata_.push_back(stands_for_.function->input_metadata(stands_for_.input_nr));
  }
  std::string name() const override { return "torchbridge::CheckpointGradientSink"; }
  // Only ever captured (it is an output of the nested backward, never needed), so never run.
  variable_list apply(variable_list&& /*grads*/) override { return {}; }
  const Edge& stands_for() const { return stands_for_; }

 private:
  Edge stands_for_;  // the outside node and input whose gradient this sink receives
};

// The outside edge an edge means. A region nested in another is recomputed during the outer
// one's backward, where its CheckpointBackward's edges were repointed to the outer sinks; its own
// recomputation reaches the outside nodes themselves.
const Edge& outside_edge(const Edge& edge) {
  const auto* sink = dynamic_cast<const GradientSink*>(edge.function.get());
  return sink != nullptr ? sink->stands_for() : edge;
}

// While it lives, every edge by which the recomputed region leaves itself points to one sink per
// distinct outside (node, input) pair; `sinks_for` maps the forward pass's leaving edges, which the
// recomputation reaches again, to their sinks. The recomputed graph is this backward call's own,
// so editing it touches nothing anyone else holds, and the edges are put back on destruction: a
// backward with create_graph builds a graph of gradients that runs through the recomputed nodes,
// and its own backward must reach the outside nodes, not the sinks. Edge lists are edited in
// place: Node::set_next_edge would recompute topological numbers, which autograd forbids once a
// node has a parent; the sinks' number is 0, below any region node's.
class RegionBoundary {
 public:
  RegionBoundary(const RegionBoundary&) = delete;
  RegionBoundary& operator=(const RegionBoundary&) = delete;
  ~RegionBoundary() {
    for (auto& [node, index, outside] : repointed_) node->next_edges()[index] = std::move(outside);
  }

  // The recomputed outputs keep the region's nodes alive for as long as this object lives.
  RegionBoundary(const std::vector<at::Tensor>& recomputed_roots, const RegionNodes& region) : region_(region) {
    std::vector<Node*> pending;
    std::unordered_set<const Node*> visited;
    for (const at::Tensor& root : recomputed_roots) {
      Node* node = torch::autograd::impl::gradient_edge(root).function.get();
      if (node != nullptr && region_.contains(node) && visited.insert(node).second) pending.push_back(node);
    }
    while (!pending.empty()) {
      Node* node = pending.back();
      pending.pop_back();
      edge_list& edges = node->next_edges();
      for (size_t index = 0; index < edges.size(); ++index) {
        Edge& edge = edges[index];
        if (!edge.is_valid()) continue;
        Node* next = edge.function.get();
        if (region_.contains(next)) {
          if (visited.insert(next).second) pending.push_back(next);
        } else {
          Edge sink = sink_for(edge);
          repointed_.emplace_back(node, index, std::exchange(edge, std::move(sink)));
        }
      }
    }
  }

  // A root's gradient edge, or its sink's when the root itself lies outside the region (a region
  // that returns one of its inputs as it is).
  Edge root_edge(const at::Tensor& root) {
    Edge edge = torch::autograd::impl::gradient_edge(root);
    return region_.contains(edge.function.get()) ? edge : sink_for(edge);
  }

  edge_list sinks_for(const edge_list& leaving) {
    edge_list sinks;
    for (const Edge& edge : leaving) sinks.push_back(sink_for(edge));
    return sinks;
  }

 private:
  Edge sink_for(const Edge& edge) {
    const Edge& outside = outside_edge(edge);
    auto [it, added] = sinks_.try_emplace({outside.function.get(), outside.input_nr});
    if (added) it->second = make_node<GradientSink>(outside);
    return Edge(it->second, 0);
  }

  RegionNodes region_;
  std::map<std::pair<const Node*, uint32_t>, NodePtr> sinks_;
  std::vector<std::tuple<Node*, size_t, Edge>> repointed_;  // the node, the edge's index, the edge it had
};

void check_unchanged(const std::vector<at::Tensor>& inputs, const std::vector<uint32_t>& versions, const char* when) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    TORCH_CHECK(inputs[i]._version() == versions[i], "torchbridge checkpoint: input ", i, " was modified in place ",
                when, " (its version went from ", versions[i], " to ", inputs[i]._version(),
                "); the region is recomputed from its inputs during backward, so they must stay unchanged");
  }
}

std::vector<uint32_t> versions_of(const std::vector<at::Tensor>& inputs) {
  std::vector<uint32_t> versions;
  for (const at::Tensor& input : inputs) versions.push_back(input.defined() ? input._version() : 0);
  return versions;
}

}  // namespace

struct CheckpointRegion::State {
  std::vector<at::Tensor> inputs;
  std::vector<uint32_t> input_versions;
  CheckpointOptions options;
  std::vector<detail::GeneratorState> random_state;
  detail::AutocastState autocast_state;
  uint64_t thread_id = 0;
  uint64_t first_sequence_nr = 0;
  bool finished = false;
  recomputation::RecomputationRecord recorded_layer_state;  // what stateful layers (FP8) used in the forward pass
  // Declared after the record it points to, so that it ends first.
  std::optional<recomputation::RecomputationRecord::Scope> forward_pass;
};

namespace {

// Replaces a finished region in the graph. Its inputs (in autograd's sense) are the region's
// outputs that required grad; its next edges are the region's leaving edges.
class CheckpointBackward : public Node {
 public:
  CheckpointBackward(edge_list&& leaving, std::unique_ptr<CheckpointRegion::State> state,
                     CheckpointRegion::Recompute recompute, std::vector<OutputMetadata> outputs,
                     std::vector<size_t> attached_outputs)
      : Node(std::move(leaving)),
        state_(std::move(state)),
        recompute_(std::move(recompute)),
        outputs_(std::move(outputs)),
        attached_outputs_(std::move(attached_outputs)) {}

  std::string name() const override { return "torchbridge::CheckpointBackward"; }

  void release_variables() override {
    // Runs after backward without retain_graph: the inputs and the function (which may hold
    // modules or Python objects) go now, not when the graph is destroyed.
    recompute_ = nullptr;
    state_->inputs.clear();
  }

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(recompute_, "torchbridge checkpoint: trying to backward through a checkpointed region a second "
                "time, after its saved inputs were freed; pass retain_graph=true to the first backward to do that");
    check_unchanged(state_->inputs, state_->input_versions, "after the region's forward pass");
    const bool create_graph = torch::autograd::GradMode::is_enabled();

    std::vector<at::Tensor> recomputed;
    const uint64_t recompute_thread = at::RecordFunction::currentThreadId();
    const uint64_t recompute_begin = at::sequence_number::peek();
    {
      std::optional<detail::RandomStateReplay> random;
      if (state_->options.preserve_rng_state) random.emplace(state_->random_state);
      const auto autocast = detail::replay_autocast_state(state_->autocast_state);
      torch::autograd::AutoGradMode grad_mode(true);
      const recomputation::RecomputationRecord::Scope replaying(state_->recorded_layer_state,
                                                             recomputation::RecomputationRecord::Phase::kRecomputation);
      recomputed = recompute_();
    }
    if (state_->options.check_recomputed_metadata) check_metadata(recomputed);

    std::vector<at::Tensor> root_tensors;
    variable_list root_grads;
    for (size_t k = 0; k < attached_outputs_.size(); ++k) {
      if (!grads[k].defined()) continue;
      const at::Tensor& output = recomputed.at(attached_outputs_[k]);
      TORCH_CHECK(output.requires_grad(), "torchbridge checkpoint: output ", attached_outputs_[k],
                  " required grad in the forward pass but not when recomputed; the region must compute the same "
                  "thing both times");
      root_tensors.push_back(output);
      root_grads.push_back(std::move(grads[k]));
    }
    if (root_tensors.empty()) return variable_list(num_outputs());
    RegionBoundary boundary(root_tensors,
                            RegionNodes{recompute_thread, recompute_begin, at::sequence_number::peek()});
    edge_list roots;
    for (const at::Tensor& root : root_tensors) roots.push_back(boundary.root_edge(root));
    return torch::autograd::Engine::get_default_engine().execute(roots, root_grads, /*keep_graph=*/create_graph,
                                                                 create_graph, /*accumulate_grad=*/false,
                                                                 boundary.sinks_for(next_edges()));
  }

 private:
  void check_metadata(const std::vector<at::Tensor>& recomputed) const {
    TORCH_CHECK(recomputed.size() == outputs_.size(), "torchbridge checkpoint: the region returned ",
                outputs_.size(), " outputs in the forward pass but ", recomputed.size(),
                " when recomputed; the region must compute the same thing both times");
    for (size_t i = 0; i < outputs_.size(); ++i) {
      const OutputMetadata now = metadata_of(recomputed[i]);
      const OutputMetadata& then = outputs_[i];
      TORCH_CHECK(now.defined == then.defined && now.sizes == then.sizes && now.dtype == then.dtype &&
                      now.device == then.device,
                  "torchbridge checkpoint: output ", i, " was ", describe(then), " in the forward pass but ",
                  describe(now), " when recomputed; the region must compute the same thing both times");
    }
  }

  std::unique_ptr<CheckpointRegion::State> state_;
  CheckpointRegion::Recompute recompute_;
  std::vector<OutputMetadata> outputs_;
  std::vector<size_t> attached_outputs_;  // for each of this node's inputs, the region output it carries
};

}  // namespace

CheckpointRegion::CheckpointRegion(const std::vector<at::Tensor>& inputs, const CheckpointOptions& options)
    : state_(std::make_unique<State>()) {
  state_->inputs = inputs;
  state_->input_versions = versions_of(inputs);
  state_->options = options;
  if (options.preserve_rng_state) state_->random_state = detail::capture_random_state(inputs);
  state_->autocast_state = detail::capture_autocast_state();
  state_->thread_id = at::RecordFunction::currentThreadId();
  state_->first_sequence_nr = at::sequence_number::peek();
  state_->forward_pass.emplace(state_->recorded_layer_state, recomputation::RecomputationRecord::Phase::kForwardPass);
}

CheckpointRegion::~CheckpointRegion() = default;

void CheckpointRegion::finish(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& attach_to,
                              Recompute recompute) {
  TORCH_CHECK(state_ && !state_->finished, "torchbridge checkpoint: CheckpointRegion::finish called twice");
  state_->forward_pass.reset();
  TORCH_CHECK(at::RecordFunction::currentThreadId() == state_->thread_id,
              "torchbridge checkpoint: a region must finish on the thread it started on");
  TORCH_CHECK_VALUE(attach_to.size() == outputs.size(), "torchbridge checkpoint: ", outputs.size(),
                    " outputs but ", attach_to.size(), " tensors to attach them to");
  TORCH_CHECK_VALUE(recompute, "torchbridge checkpoint: no recompute function was given");
  state_->finished = true;
  check_unchanged(state_->inputs, state_->input_versions, "by the region itself");

  const RegionNodes region{state_->thread_id, state_->first_sequence_nr, at::sequence_number::peek()};
  std::vector<OutputMetadata> metadata;
  std::vector<size_t> attached_outputs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    metadata.push_back(metadata_of(outputs[i]));
    if (!outputs[i].defined() || !outputs[i].requires_grad()) continue;
    TORCH_CHECK_VALUE(attach_to[i].defined() && !attach_to[i].requires_grad(), "torchbridge checkpoint: output ", i,
                      " requires grad, so it needs a detached alias to carry the region's backward");
    attached_outputs.push_back(i);
  }
  if (attached_outputs.empty()) return;  // nothing to differentiate: no graph to keep

  edge_list leaving = edges_leaving_region(outputs, region);
  auto node = make_node<CheckpointBackward>(std::move(leaving), std::move(state_), std::move(recompute),
                                           std::move(metadata), attached_outputs);
  for (size_t i : attached_outputs) torch::autograd::set_history(attach_to[i], node);
}

std::vector<at::Tensor> checkpoint(const RegionFunction& fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options) {
  TORCH_CHECK_VALUE(fn, "torchbridge checkpoint: no function was given");
  if (!torch::autograd::GradMode::is_enabled() || c10::InferenceMode::is_enabled()) return fn(inputs);

  CheckpointRegion region(inputs, options);
  std::vector<at::Tensor> outputs = fn(inputs);
  std::vector<at::Tensor> results(outputs.size());
  bool any_differentiable = false;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const bool differentiable = outputs[i].defined() && outputs[i].requires_grad();
    if (differentiable) results[i] = outputs[i].detach();
    any_differentiable = any_differentiable || differentiable;
  }
  // Not an error: a region of frozen layers (fine-tuning) is legitimate and torch allows it. But
  // the user asked to save memory for a backward pass that cannot reach this region, so say so.
  if (!any_differentiable) {
    TORCH_WARN_ONCE("torchbridge checkpoint: none of the region's ", outputs.size(), " outputs requires grad (no ",
                    "input or parameter it uses does), so backward never reaches the region and nothing is ",
                    "recomputed; a backward through these outputs fails with torch's 'does not require grad'. ",
                    "Checkpoint regions that train, or run this one under NoGradGuard");
  }
  region.finish(outputs, results, [fn, inputs] { return fn(inputs); });
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!results[i].defined()) results[i] = outputs[i];
  }
  // `outputs` goes out of scope here, and with it the region's graph and saved activations.
  return results;
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const CheckpointOptions& options) {
  TORCH_CHECK_VALUE(fn, "torchbridge checkpoint: no function was given");
  return checkpoint([fn](const std::vector<at::Tensor>& inputs) { return std::vector<at::Tensor>{fn(inputs[0])}; },
                    std::vector<at::Tensor>{input}, options)[0];
}

}  // namespace torchbridge::memory
