#include <torchbridge/validation/builtin_models.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/jit/api/compilation_unit.h>

#include <cmath>
#include <map>
#include <memory>

namespace torchbridge::validation {
namespace {

constexpr int64_t kWidth = 64;   // transformer model width
constexpr int64_t kHeads = 4;

// Every module type lives in one compilation unit per model; the CU mangles repeated class
// names (two Linear layers get distinct types), as TorchScript does for Python modules.
class ModelBuilder {
 public:
  explicit ModelBuilder(uint64_t seed)
      : unit_(std::make_shared<torch::jit::CompilationUnit>()), generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

  torch::jit::Module module(const std::string& type, const std::string& forward_source) {
    torch::jit::Module m(c10::QualifiedName("__torch__.torchbridge.builtin." + type), unit_, /*shouldMangle=*/true);
    sources_[m.type().get()] = forward_source;
    // Scripted Python modules carry this attribute; train()/eval() and Python's
    // ScriptModule.training read it.
    m.register_attribute("training", c10::BoolType::get(), true);
    return m;
  }
  // Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)), the default initialisation of torch.nn layers.
  at::Tensor uniform(std::vector<int64_t> shape, int64_t fan_in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    return at::empty(shape).uniform_(-bound, bound, generator_);
  }
  // Parameters of modules built in C++ do not require gradients unless told to.
  static at::Tensor parameter(at::Tensor value) { return value.set_requires_grad(true); }
  torch::jit::Module linear(int64_t in, int64_t out) {
    auto m = module("Linear", "def forward(self, x):\n  return torch.linear(x, self.weight, self.bias)\n");
    m.register_parameter("weight", parameter(uniform({out, in}, in)), false);
    m.register_parameter("bias", parameter(uniform({out}, in)), false);
    return m;
  }
  torch::jit::Module conv(int64_t in, int64_t out, int64_t kernel) {
    auto m = module("Conv2d",
                    "def forward(self, x):\n"
                    "  return torch.conv2d(x, self.weight, self.bias, [1, 1], [" + std::to_string(kernel / 2) + ", " +
                        std::to_string(kernel / 2) + "], [1, 1], 1)\n");
    m.register_parameter("weight", parameter(uniform({out, in, kernel, kernel}, in * kernel * kernel)), false);
    m.register_parameter("bias", parameter(uniform({out}, in * kernel * kernel)), false);
    return m;
  }
  torch::jit::Module layer_norm(int64_t width) {
    auto m = module("LayerNorm",
                    "def forward(self, x):\n"
                    "  return torch.layer_norm(x, [" + std::to_string(width) + "], self.weight, self.bias, 1e-5)\n");
    m.register_parameter("weight", parameter(at::ones({width})), false);
    m.register_parameter("bias", parameter(at::zeros({width})), false);
    return m;
  }
  // Methods are compiled last, children first: a forward can only call submodules whose own
  // forward already exists. (Sources call `self.child.forward(x)`: TorchScript compiled from C++
  // has no module `__call__`.)
  torch::jit::Module finish(torch::jit::Module root) {
    define_tree(root);
    root.eval();  // no dropout or batch-norm statistics anyway; eval keeps that explicit
    return root;
  }

 private:
  std::shared_ptr<torch::jit::CompilationUnit> unit_;
  at::Generator generator_;
  std::map<const c10::ClassType*, std::string> sources_;  // forward source per module type

  void define_tree(torch::jit::Module& m) {
    for (auto child : m.children()) define_tree(child);
    m.define(sources_.at(m.type().get()));
  }
};

torch::jit::Module make_mlp(ModelBuilder& b) {
  auto root = b.module("MLP",
                       "def forward(self, x):\n"
                       "  x = torch.relu(self.fc1.forward(x))\n"
                       "  x = torch.relu(self.fc2.forward(x))\n"
                       "  return self.fc3.forward(x)\n");
  root.register_module("fc1", b.linear(32, 64));
  root.register_module("fc2", b.linear(64, 64));
  root.register_module("fc3", b.linear(64, 10));
  return b.finish(root);
}

torch::jit::Module make_cnn(ModelBuilder& b) {
  auto root = b.module("CNN",
                       "def forward(self, x):\n"
                       "  x = torch.max_pool2d(torch.relu(self.conv1.forward(x)), [2, 2])\n"
                       "  x = torch.relu(self.conv2.forward(x))\n"
                       "  x = torch.mean(x, [2, 3])\n"
                       "  return self.fc.forward(x)\n");
  root.register_module("conv1", b.conv(3, 8, 3));
  root.register_module("conv2", b.conv(8, 16, 3));
  root.register_module("fc", b.linear(16, 10));
  return b.finish(root);
}

// A pre-norm transformer block (self-attention and a GELU MLP, both residual) with input and
// output projections, so it maps [batch, sequence, 32] features to [batch, sequence, 32].
torch::jit::Module make_transformer(ModelBuilder& b) {
  const std::string heads = std::to_string(kHeads), head_width = std::to_string(kWidth / kHeads);
  auto attention = b.module("SelfAttention",
                            "def forward(self, x):\n"
                            "  B, T, C = x.size(0), x.size(1), x.size(2)\n"
                            "  q, k, v = self.qkv.forward(x).chunk(3, -1)\n"
                            "  q = q.reshape(B, T, " + heads + ", " + head_width + ").transpose(1, 2)\n"
                            "  k = k.reshape(B, T, " + heads + ", " + head_width + ").transpose(1, 2)\n"
                            "  v = v.reshape(B, T, " + heads + ", " + head_width + ").transpose(1, 2)\n"
                            "  scores = torch.matmul(q, k.transpose(-2, -1)) * " +
                                std::to_string(1.0 / std::sqrt(double(kWidth / kHeads))) + "\n"
                            "  y = torch.matmul(torch.softmax(scores, -1), v)\n"
                            "  return self.proj.forward(y.transpose(1, 2).reshape(B, T, C))\n");
  attention.register_module("qkv", b.linear(kWidth, 3 * kWidth));
  attention.register_module("proj", b.linear(kWidth, kWidth));
  auto mlp = b.module("FeedForward", "def forward(self, x):\n  return self.fc2.forward(torch.gelu(self.fc1.forward(x)))\n");
  mlp.register_module("fc1", b.linear(kWidth, 2 * kWidth));
  mlp.register_module("fc2", b.linear(2 * kWidth, kWidth));
  auto root = b.module("TransformerBlock",
                       "def forward(self, x):\n"
                       "  h = self.embed.forward(x)\n"
                       "  h = h + self.attention.forward(self.norm1.forward(h))\n"
                       "  h = h + self.mlp.forward(self.norm2.forward(h))\n"
                       "  return self.head.forward(self.norm3.forward(h))\n");
  root.register_module("embed", b.linear(32, kWidth));
  root.register_module("norm1", b.layer_norm(kWidth));
  root.register_module("attention", attention);
  root.register_module("norm2", b.layer_norm(kWidth));
  root.register_module("mlp", mlp);
  root.register_module("norm3", b.layer_norm(kWidth));
  root.register_module("head", b.linear(kWidth, 32));
  return b.finish(root);
}

}  // namespace

const std::vector<BuiltinModel>& builtin_models() {
  static const std::vector<BuiltinModel> models = {
      {"mlp", "three linear layers with ReLU, 32 -> 64 -> 64 -> 10", {16, 32}},
      {"cnn", "two 3x3 convolutions with ReLU and max pooling, global average pooling, linear head", {4, 3, 16, 16}},
      {"transformer", "pre-norm transformer block (4-head self-attention, GELU MLP), width 64, 32 features in and out",
       {8, 64, 32}},
  };
  return models;
}

const BuiltinModel& builtin_model_info(const std::string& name) {
  std::string known;
  for (const auto& model : builtin_models()) {
    if (model.name == name) return model;
    known += (known.empty() ? "" : ", ") + model.name;
  }
  TORCH_CHECK_VALUE(false, "unknown built-in model '", name, "': expected one of ", known);
}

torch::jit::Module make_builtin_model(const std::string& name, uint64_t seed) {
  builtin_model_info(name);  // validates the name
  ModelBuilder builder(seed);
  if (name == "mlp") return make_mlp(builder);
  if (name == "cnn") return make_cnn(builder);
  return make_transformer(builder);
}

}  // namespace torchbridge::validation
