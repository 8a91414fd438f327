// At least 100 distinct aten operators must match the CPU on every backend, forward and, where
// differentiable, backward. Inputs are generated on the CPU with a fixed seed and copied over.
#include "contract.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::contract {
namespace {

using at::Tensor;
using Inputs = std::vector<Tensor>;

// kDistinctIndex: a 2-D index whose rows hold distinct values (scatter with a repeated index
// leaves either value, in no defined order: the H100 picked another than the CPU).
enum class Kind { kNormal, kPositive, kUnit, kAboveOne, kIndex, kDistinctIndex, kMask, kInt };

struct Input {
  std::vector<int64_t> shape;
  Kind kind = Kind::kNormal;
  int64_t bound = 0;  // kIndex, kDistinctIndex: values in [0, bound)
};

struct OpCase {
  std::string op;  // the aten operator exercised (distinctness is asserted)
  std::vector<Input> inputs;
  std::function<Tensor(const Inputs&)> fn;
  bool differentiable = true;
};

Tensor make_input(const Input& in) {
  switch (in.kind) {
    case Kind::kNormal: return at::randn(in.shape, at::kDouble);
    case Kind::kPositive: return at::rand(in.shape, at::kDouble) + 0.5;
    case Kind::kUnit: return at::rand(in.shape, at::kDouble) * 1.6 - 0.8;
    case Kind::kAboveOne: return at::rand(in.shape, at::kDouble) + 1.5;
    case Kind::kIndex: return at::randint(0, in.bound, in.shape, at::kLong);
    case Kind::kDistinctIndex:  // each row: the first columns of a random permutation of [0, bound)
      return at::rand({in.shape.at(0), in.bound}).argsort(/*stable=*/false, /*dim=*/1).narrow(1, 0, in.shape.at(1)).contiguous();
    case Kind::kMask: return at::rand(in.shape) > 0.5;
    case Kind::kInt: return at::randint(-50, 50, in.shape, at::kInt);
  }
  return {};
}

const Input M{{4, 5}}, N{{4, 5}}, P{{4, 5}, Kind::kPositive}, U{{4, 5}, Kind::kUnit}, A1{{4, 5}, Kind::kAboveOne};
const Input IMG{{2, 3, 8, 8}}, SEQ{{2, 3, 10}}, MASK{{4, 5}, Kind::kMask}, I1{{4, 5}, Kind::kInt}, I2{{4, 5}, Kind::kInt};

std::vector<OpCase> operator_cases() {
  using namespace at;
  return {
      // ---- unary elementwise
      {"abs", {M}, [](const Inputs& x) { return x[0].abs(); }},
      {"neg", {M}, [](const Inputs& x) { return x[0].neg(); }},
      {"exp", {M}, [](const Inputs& x) { return x[0].exp(); }},
      {"exp2", {M}, [](const Inputs& x) { return x[0].exp2(); }},
      {"expm1", {M}, [](const Inputs& x) { return x[0].expm1(); }},
      {"log", {P}, [](const Inputs& x) { return x[0].log(); }},
      {"log2", {P}, [](const Inputs& x) { return x[0].log2(); }},
      {"log10", {P}, [](const Inputs& x) { return x[0].log10(); }},
      {"log1p", {P}, [](const Inputs& x) { return x[0].log1p(); }},
      {"sqrt", {P}, [](const Inputs& x) { return x[0].sqrt(); }},
      {"rsqrt", {P}, [](const Inputs& x) { return x[0].rsqrt(); }},
      {"sin", {M}, [](const Inputs& x) { return x[0].sin(); }},
      {"cos", {M}, [](const Inputs& x) { return x[0].cos(); }},
      {"tan", {U}, [](const Inputs& x) { return x[0].tan(); }},
      {"asin", {U}, [](const Inputs& x) { return x[0].asin(); }},
      {"acos", {U}, [](const Inputs& x) { return x[0].acos(); }},
      {"atan", {M}, [](const Inputs& x) { return x[0].atan(); }},
      {"sinh", {M}, [](const Inputs& x) { return x[0].sinh(); }},
      {"cosh", {M}, [](const Inputs& x) { return x[0].cosh(); }},
      {"tanh", {M}, [](const Inputs& x) { return x[0].tanh(); }},
      {"asinh", {M}, [](const Inputs& x) { return x[0].asinh(); }},
      {"acosh", {A1}, [](const Inputs& x) { return x[0].acosh(); }},
      {"atanh", {U}, [](const Inputs& x) { return x[0].atanh(); }},
      {"sigmoid", {M}, [](const Inputs& x) { return x[0].sigmoid(); }},
      {"relu", {M}, [](const Inputs& x) { return at::relu(x[0]); }},
      {"gelu", {M}, [](const Inputs& x) { return at::gelu(x[0]); }},
      {"silu", {M}, [](const Inputs& x) { return at::silu(x[0]); }},
      {"mish", {M}, [](const Inputs& x) { return at::mish(x[0]); }},
      {"elu", {M}, [](const Inputs& x) { return at::elu(x[0]); }},
      {"leaky_relu", {M}, [](const Inputs& x) { return at::leaky_relu(x[0], 0.1); }},
      {"hardtanh", {M}, [](const Inputs& x) { return at::hardtanh(x[0], -0.5, 0.5); }},
      {"softplus", {M}, [](const Inputs& x) { return at::softplus(x[0]); }},
      {"erf", {M}, [](const Inputs& x) { return x[0].erf(); }},
      {"erfc", {M}, [](const Inputs& x) { return x[0].erfc(); }},
      {"reciprocal", {P}, [](const Inputs& x) { return x[0].reciprocal(); }},
      {"square", {M}, [](const Inputs& x) { return x[0].square(); }},
      {"lgamma", {P}, [](const Inputs& x) { return x[0].lgamma(); }},
      {"digamma", {P}, [](const Inputs& x) { return x[0].digamma(); }},
      {"logit", {{{4, 5}, Kind::kPositive}}, [](const Inputs& x) { return (x[0] / 2.0).logit(); }},
      {"deg2rad", {M}, [](const Inputs& x) { return x[0].deg2rad(); }},
      {"sign", {M}, [](const Inputs& x) { return x[0].sign(); }, false},
      {"floor", {M}, [](const Inputs& x) { return x[0].floor(); }, false},
      {"ceil", {M}, [](const Inputs& x) { return x[0].ceil(); }, false},
      {"round", {M}, [](const Inputs& x) { return x[0].round(); }, false},
      {"trunc", {M}, [](const Inputs& x) { return x[0].trunc(); }, false},
      {"frac", {M}, [](const Inputs& x) { return x[0].frac(); }},
      {"nan_to_num", {M}, [](const Inputs& x) { return x[0].log().nan_to_num(0.0, 1.0, -1.0); }, false},
      // ---- binary / ternary elementwise
      {"add", {M, N}, [](const Inputs& x) { return x[0] + x[1]; }},
      {"sub", {M, N}, [](const Inputs& x) { return x[0] - x[1]; }},
      {"mul", {M, N}, [](const Inputs& x) { return x[0] * x[1]; }},
      {"div", {M, P}, [](const Inputs& x) { return x[0] / x[1]; }},
      {"pow", {P, N}, [](const Inputs& x) { return x[0].pow(x[1]); }},
      {"maximum", {M, N}, [](const Inputs& x) { return at::maximum(x[0], x[1]); }},
      {"minimum", {M, N}, [](const Inputs& x) { return at::minimum(x[0], x[1]); }},
      {"atan2", {M, N}, [](const Inputs& x) { return at::atan2(x[0], x[1]); }},
      {"fmod", {M, P}, [](const Inputs& x) { return at::fmod(x[0], x[1]); }},
      {"remainder", {M, P}, [](const Inputs& x) { return at::remainder(x[0], x[1]); }},
      {"hypot", {M, N}, [](const Inputs& x) { return at::hypot(x[0], x[1]); }},
      {"lerp", {M, N, U}, [](const Inputs& x) { return at::lerp(x[0], x[1], x[2]); }},
      {"addcmul", {M, N, U}, [](const Inputs& x) { return at::addcmul(x[0], x[1], x[2], 0.5); }},
      {"addcdiv", {M, N, P}, [](const Inputs& x) { return at::addcdiv(x[0], x[1], x[2], 0.5); }},
      {"where", {MASK, M, N}, [](const Inputs& x) { return at::where(x[0], x[1], x[2]); }},
      {"clamp", {M}, [](const Inputs& x) { return x[0].clamp(-0.5, 0.5); }},
      {"eq", {I1, I2}, [](const Inputs& x) { return x[0].eq(x[1]); }, false},
      {"ne", {I1, I2}, [](const Inputs& x) { return x[0].ne(x[1]); }, false},
      {"lt", {M, N}, [](const Inputs& x) { return x[0].lt(x[1]); }, false},
      {"gt", {M, N}, [](const Inputs& x) { return x[0].gt(x[1]); }, false},
      {"le", {M, N}, [](const Inputs& x) { return x[0].le(x[1]); }, false},
      {"ge", {M, N}, [](const Inputs& x) { return x[0].ge(x[1]); }, false},
      {"logical_and", {MASK, MASK}, [](const Inputs& x) { return at::logical_and(x[0], x[1]); }, false},
      {"logical_or", {MASK, MASK}, [](const Inputs& x) { return at::logical_or(x[0], x[1]); }, false},
      {"logical_xor", {MASK, MASK}, [](const Inputs& x) { return at::logical_xor(x[0], x[1]); }, false},
      {"logical_not", {MASK}, [](const Inputs& x) { return at::logical_not(x[0]); }, false},
      {"bitwise_and", {I1, I2}, [](const Inputs& x) { return at::bitwise_and(x[0], x[1]); }, false},
      {"bitwise_or", {I1, I2}, [](const Inputs& x) { return at::bitwise_or(x[0], x[1]); }, false},
      {"floor_divide", {I1, {{4, 5}, Kind::kIndex, 9}}, [](const Inputs& x) { return at::floor_divide(x[0], x[1] + 1); }, false},
      // ---- reductions and scans
      {"sum", {M}, [](const Inputs& x) { return x[0].sum(1); }},
      {"mean", {M}, [](const Inputs& x) { return x[0].mean(0); }},
      {"prod", {P}, [](const Inputs& x) { return x[0].prod(1); }},
      {"max.dim", {M}, [](const Inputs& x) { return std::get<0>(x[0].max(1)); }},
      {"min.dim", {M}, [](const Inputs& x) { return std::get<0>(x[0].min(0)); }},
      {"amax", {M}, [](const Inputs& x) { return x[0].amax(1); }},
      {"amin", {M}, [](const Inputs& x) { return x[0].amin(1); }},
      {"argmax", {M}, [](const Inputs& x) { return x[0].argmax(1); }, false},
      {"argmin", {M}, [](const Inputs& x) { return x[0].argmin(0); }, false},
      {"std", {M}, [](const Inputs& x) { return x[0].std(1); }},
      {"var", {M}, [](const Inputs& x) { return x[0].var(0); }},
      {"linalg_vector_norm", {M}, [](const Inputs& x) { return at::linalg_vector_norm(x[0], 2, {1}); }},
      {"logsumexp", {M}, [](const Inputs& x) { return x[0].logsumexp({1}); }},
      {"cumsum", {M}, [](const Inputs& x) { return x[0].cumsum(1); }},
      {"cumprod", {P}, [](const Inputs& x) { return x[0].cumprod(1); }},
      {"all", {MASK}, [](const Inputs& x) { return x[0].all(1); }, false},
      {"any", {MASK}, [](const Inputs& x) { return x[0].any(0); }, false},
      {"sort", {M}, [](const Inputs& x) { return std::get<0>(x[0].sort(1)); }},
      {"topk", {M}, [](const Inputs& x) { return std::get<0>(x[0].topk(2, 1)); }},
      {"median.dim", {M}, [](const Inputs& x) { return std::get<0>(x[0].median(1)); }},
      // ---- linear algebra and neural-network layers
      {"mm", {{{4, 6}}, {{6, 3}}}, [](const Inputs& x) { return at::mm(x[0], x[1]); }},
      {"matmul", {{{2, 4, 6}}, {{6, 3}}}, [](const Inputs& x) { return at::matmul(x[0], x[1]); }},
      {"bmm", {{{2, 4, 6}}, {{2, 6, 3}}}, [](const Inputs& x) { return at::bmm(x[0], x[1]); }},
      {"addmm", {{{4, 3}}, {{4, 6}}, {{6, 3}}}, [](const Inputs& x) { return at::addmm(x[0], x[1], x[2]); }},
      {"linear", {{{4, 6}}, {{3, 6}}, {{3}}}, [](const Inputs& x) { return at::linear(x[0], x[1], x[2]); }},
      {"dot", {{{7}}, {{7}}}, [](const Inputs& x) { return at::dot(x[0], x[1]); }},
      {"outer", {{{4}}, {{5}}}, [](const Inputs& x) { return at::outer(x[0], x[1]); }},
      {"einsum", {{{2, 3}}, {{3, 4}}}, [](const Inputs& x) { return at::einsum("ij,jk->ik", {x[0], x[1]}); }},
      {"conv1d", {SEQ, {{4, 3, 3}}, {{4}}}, [](const Inputs& x) { return at::conv1d(x[0], x[1], x[2]); }},
      {"conv2d", {IMG, {{4, 3, 3, 3}}, {{4}}}, [](const Inputs& x) { return at::conv2d(x[0], x[1], x[2], 1, 1); }},
      {"conv_transpose2d", {IMG, {{3, 2, 3, 3}}}, [](const Inputs& x) { return at::conv_transpose2d(x[0], x[1]); }},
      {"max_pool2d", {IMG}, [](const Inputs& x) { return at::max_pool2d(x[0], {2, 2}); }},
      {"avg_pool2d", {IMG}, [](const Inputs& x) { return at::avg_pool2d(x[0], {2, 2}); }},
      {"adaptive_avg_pool2d", {IMG}, [](const Inputs& x) { return at::adaptive_avg_pool2d(x[0], {3, 3}); }},
      {"batch_norm", {IMG, {{3}}, {{3}}},
       [](const Inputs& x) { return at::batch_norm(x[0], x[1], x[2], {}, {}, true, 0.1, 1e-5, false); }},
      {"layer_norm", {{{4, 6}}, {{6}}, {{6}}}, [](const Inputs& x) { return at::layer_norm(x[0], {6}, x[1], x[2]); }},
      {"group_norm", {IMG, {{3}}, {{3}}}, [](const Inputs& x) { return at::group_norm(x[0], 3, x[1], x[2]); }},
      {"softmax", {M}, [](const Inputs& x) { return at::softmax(x[0], 1); }},
      {"log_softmax", {M}, [](const Inputs& x) { return at::log_softmax(x[0], 1); }},
      {"cross_entropy_loss", {M, {{4}, Kind::kIndex, 5}},
       [](const Inputs& x) { return at::cross_entropy_loss(x[0], x[1]); }},
      {"nll_loss", {M, {{4}, Kind::kIndex, 5}}, [](const Inputs& x) { return at::nll_loss(x[0].log_softmax(1), x[1]); }},
      {"mse_loss", {M, N}, [](const Inputs& x) { return at::mse_loss(x[0], x[1]); }},
      {"l1_loss", {M, N}, [](const Inputs& x) { return at::l1_loss(x[0], x[1]); }},
      {"smooth_l1_loss", {M, N}, [](const Inputs& x) { return at::smooth_l1_loss(x[0], x[1]); }},
      {"binary_cross_entropy_with_logits", {M, {{4, 5}, Kind::kUnit}},
       [](const Inputs& x) { return at::binary_cross_entropy_with_logits(x[0], x[1].abs()); }},
      {"embedding", {{{10, 3}}, {{6}, Kind::kIndex, 10}}, [](const Inputs& x) { return at::embedding(x[0], x[1]); }},
      {"upsample_bilinear2d", {IMG},
       [](const Inputs& x) { return at::upsample_bilinear2d(x[0], {12, 12}, false); }},
      {"constant_pad_nd", {IMG}, [](const Inputs& x) { return at::constant_pad_nd(x[0], {1, 2, 0, 1}, 0.5); }},
      {"cosine_similarity", {M, N}, [](const Inputs& x) { return at::cosine_similarity(x[0], x[1], 1); }},
      {"pairwise_distance", {M, N}, [](const Inputs& x) { return at::pairwise_distance(x[0], x[1]); }},
      {"tril", {M}, [](const Inputs& x) { return x[0].tril(); }},
      {"triu", {M}, [](const Inputs& x) { return x[0].triu(1); }},
      {"trace", {{{5, 5}}}, [](const Inputs& x) { return x[0].trace(); }},
      {"diag", {{{5}}}, [](const Inputs& x) { return x[0].diag(); }},
      {"linalg_cross", {{{4, 3}}, {{4, 3}}}, [](const Inputs& x) { return at::linalg_cross(x[0], x[1]); }},
      // ---- indexing, shape and view operators
      {"index_select", {M, {{3}, Kind::kIndex, 4}}, [](const Inputs& x) { return x[0].index_select(0, x[1]); }},
      {"gather", {M, {{4, 2}, Kind::kIndex, 5}}, [](const Inputs& x) { return x[0].gather(1, x[1]); }},
      {"scatter", {M, {{4, 2}, Kind::kDistinctIndex, 5}, {{4, 2}}},
       [](const Inputs& x) { return x[0].scatter(1, x[1], x[2]); }, false},
      {"scatter_add", {M, {{4, 2}, Kind::kIndex, 5}, {{4, 2}}},
       [](const Inputs& x) { return x[0].scatter_add(1, x[1], x[2]); }},
      {"index_add", {M, {{2}, Kind::kIndex, 4}, {{2, 5}}},
       [](const Inputs& x) { return x[0].index_add(0, x[1], x[2]); }},
      {"index.Tensor", {M, {{3}, Kind::kIndex, 4}}, [](const Inputs& x) { return x[0].index({x[1]}); }},
      {"index_put", {M, {{3}, Kind::kIndex, 4}, {{3, 5}}},
       [](const Inputs& x) { return x[0].index_put({x[1]}, x[2], /*accumulate=*/true); }},
      {"masked_fill", {M, MASK}, [](const Inputs& x) { return x[0].masked_fill(x[1], 2.5); }},
      {"masked_select", {M, MASK}, [](const Inputs& x) { return x[0].masked_select(x[1]); }},
      {"nonzero", {MASK}, [](const Inputs& x) { return x[0].nonzero(); }, false},
      {"take", {M, {{6}, Kind::kIndex, 20}}, [](const Inputs& x) { return x[0].take(x[1]); }},
      {"narrow", {M}, [](const Inputs& x) { return x[0].narrow(1, 1, 3) * 2; }},
      {"select", {M}, [](const Inputs& x) { return x[0].select(0, 2) * 2; }},
      {"slice", {M}, [](const Inputs& x) { return x[0].slice(1, 0, 5, 2) * 2; }},
      {"transpose", {M}, [](const Inputs& x) { return x[0].transpose(0, 1) * 2; }},
      {"permute", {IMG}, [](const Inputs& x) { return x[0].permute({0, 2, 3, 1}) * 2; }},
      {"reshape", {M}, [](const Inputs& x) { return x[0].t().reshape({10, 2}) * 2; }},
      {"view", {M}, [](const Inputs& x) { return x[0].view({5, 4}) * 2; }},
      {"flatten", {IMG}, [](const Inputs& x) { return x[0].flatten(1) * 2; }},
      {"squeeze", {{{4, 1, 5}}}, [](const Inputs& x) { return x[0].squeeze(1) * 2; }},
      {"unsqueeze", {M}, [](const Inputs& x) { return x[0].unsqueeze(1) * 2; }},
      {"expand", {{{4, 1}}}, [](const Inputs& x) { return x[0].expand({4, 6}) * 2; }},
      {"repeat", {M}, [](const Inputs& x) { return x[0].repeat({2, 3}); }},
      {"cat", {M, N}, [](const Inputs& x) { return at::cat({x[0], x[1]}, 1); }},
      {"stack", {M, N}, [](const Inputs& x) { return at::stack({x[0], x[1]}); }},
      {"split", {M}, [](const Inputs& x) { return x[0].split(2, 1)[1] * 3; }},
      {"chunk", {M}, [](const Inputs& x) { return x[0].chunk(2, 0)[0] * 3; }},
      {"flip", {M}, [](const Inputs& x) { return x[0].flip({1}); }},
      {"roll", {M}, [](const Inputs& x) { return x[0].roll({2}, {1}); }},
      {"unfold", {{{10}}}, [](const Inputs& x) { return x[0].unfold(0, 3, 2) * 2; }},
      {"clone", {M}, [](const Inputs& x) { return x[0].clone() * 2; }},
      {"contiguous", {M}, [](const Inputs& x) { return x[0].t().contiguous() * 2; }},
      {"add_", {M, N}, [](const Inputs& x) { return (x[0] * 1).add_(x[1], 0.5); }},
      {"mul_", {M, N}, [](const Inputs& x) { return (x[0] * 1).mul_(x[1]); }},
      {"clamp_", {M}, [](const Inputs& x) { return (x[0] * 1).clamp_(-0.3, 0.3); }},
      {"fill_", {M}, [](const Inputs& x) { return x[0].detach().clone().fill_(3.5); }, false},
      {"zero_", {M}, [](const Inputs& x) { return x[0].detach().clone().zero_(); }, false},
      {"sqrt_", {P}, [](const Inputs& x) { return (x[0] * 1).sqrt_(); }},
  };
}

struct Result {
  Tensor output;
  std::vector<Tensor> grads;
};

Result run_case(const OpCase& c, const Inputs& host_inputs, const c10::Device& device) {
  Inputs inputs;
  for (const auto& h : host_inputs) {
    Tensor t = h.to(device);
    if (c.differentiable && t.is_floating_point()) t = t.detach().requires_grad_(true);
    inputs.push_back(t);
  }
  const at::Tensor output = c.fn(inputs);
  Result result{output.detach().cpu(), {}};
  if (c.differentiable && output.requires_grad()) {
    const Tensor weight = at::linspace(-1.0, 1.0, output.numel(), at::kDouble).view(output.sizes()).to(device);
    (output * weight).sum().backward();
    for (const auto& t : inputs) {
      if (t.requires_grad()) result.grads.push_back(t.grad().defined() ? t.grad().cpu() : at::Tensor());
    }
  }
  return result;
}

TEST(OperatorContractTable, CoversAtLeastOneHundredDistinctOperators) {
  std::set<std::string> names;
  for (const auto& c : operator_cases()) EXPECT_TRUE(names.insert(c.op).second) << "duplicate entry " << c.op;
  EXPECT_GE(names.size(), 100u);
}

TEST_P(Contract, OperatorsMatchTheCpuForwardAndBackward) {
  int checked = 0;
  for (const auto& c : operator_cases()) {
    at::manual_seed(7);
    Inputs host_inputs;
    for (const auto& spec : c.inputs) host_inputs.push_back(make_input(spec));
    const Result expected = run_case(c, host_inputs, c10::Device(c10::kCPU));
    Result actual;
    try {
      actual = run_case(c, host_inputs, device());
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.op << " raised on " << GetParam() << ": " << std::string(e.what()).substr(0, 300);
      continue;
    }
    ASSERT_EQ(actual.output.sizes(), expected.output.sizes()) << c.op;
    ASSERT_EQ(actual.output.scalar_type(), expected.output.scalar_type()) << c.op;
    EXPECT_TRUE(at::allclose(actual.output, expected.output, 1e-6, 1e-8, /*equal_nan=*/true))
        << c.op << " forward differs on " << GetParam() << ": max abs error "
        << (actual.output.to(at::kDouble) - expected.output.to(at::kDouble)).abs().max().item<double>();
    ASSERT_EQ(actual.grads.size(), expected.grads.size()) << c.op;
    for (size_t i = 0; i < expected.grads.size(); ++i) {
      ASSERT_EQ(actual.grads[i].defined(), expected.grads[i].defined()) << c.op << " grad " << i;
      if (!expected.grads[i].defined()) continue;
      EXPECT_TRUE(at::allclose(actual.grads[i], expected.grads[i], 1e-6, 1e-8, true))
          << c.op << " gradient of input " << i << " differs on " << GetParam();
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(operator_cases().size()));
}

}  // namespace
}  // namespace torchbridge::contract
