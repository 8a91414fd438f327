// Fused recurrent cells for SDK devices. On every device but the CPU, torch's LSTM and GRU cells
// (behind nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell) compute their gates with
// _thnn_fused_lstm_cell / _thnn_fused_gru_cell and differentiate through the matching backward
// kernels. torch implements those for CUDA only and the CPU has no kernel to fall back to, so
// without these every recurrent module failed on an SDK device. They compute the cell on the host
// with torch's CPU operators under CUDA's contract: the same results, the same workspace layout
// (LSTM: the activated gates i, f, g, o; GRU: r, z, n, the previous hidden state and the hidden
// half of n's pre-activation), the same argument checks, and half/bfloat16 computed in float as
// CUDA's kernels do.
#include "sdk/registration.h"

#include "sdk/fallback.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

using at::Tensor;

bool defined(const std::optional<Tensor>& t) { return t.has_value() && t->defined(); }

// The dtype the cell math runs in: float for half and bfloat16, as CUDA's kernels accumulate.
c10::ScalarType compute_type(c10::ScalarType dtype) {
  return dtype == c10::kHalf || dtype == c10::kBFloat16 ? c10::kFloat : dtype;
}

struct Cell {
  const char* op;
  c10::ScalarType dtype;
  c10::Device device;
};

// Every tensor of a cell call: floating, of one dtype, on one device (named in the error).
void check_tensor(const Cell& cell, const Tensor& t, const char* name) {
  TORCH_CHECK(t.device() == cell.device, cell.op, ": expected ", name, " on ", cell.device, " like the first argument, got ",
              t.device());
  TORCH_CHECK(t.scalar_type() == cell.dtype, cell.op, ": expected ", name, " of dtype ", cell.dtype,
              " like the first argument, got ", t.scalar_type());
}

Cell start(const char* op, const Tensor& first, const char* name) {
  const c10::ScalarType dtype = first.scalar_type();
  TORCH_CHECK(dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kHalf || dtype == c10::kBFloat16, op,
              ": ", name, " must be float, double, half or bfloat16, got ", dtype);
  note_cpu_fallback(std::string("aten::") + op);
  return Cell{op, dtype, first.device()};
}

// Forward arguments as CUDA checks them: gates [batch, factor * hidden], both or no biases of
// [factor * hidden], the previous state [batch, hidden].
void check_forward(const Cell& cell, const Tensor& input_gates, const Tensor& hidden_gates,
                   const std::optional<Tensor>& input_bias, const std::optional<Tensor>& hidden_bias, const Tensor& prev,
                   const char* prev_name, int64_t factor) {
  TORCH_CHECK(input_gates.dim() == 2, cell.op, ": expected input_gates of 2 dimensions [batch, ", factor,
              " * hidden_size], got shape ", input_gates.sizes());
  TORCH_CHECK(hidden_gates.sizes() == input_gates.sizes(), cell.op, ": expected hidden_gates of the shape of input_gates ",
              input_gates.sizes(), ", got ", hidden_gates.sizes());
  check_tensor(cell, hidden_gates, "hidden_gates");
  const int64_t gates = input_gates.size(1);
  TORCH_CHECK(gates % factor == 0, cell.op, ": input_gates' second dimension (", gates, ") must be ", factor,
              " * hidden_size");
  TORCH_CHECK(defined(input_bias) == defined(hidden_bias), cell.op,
              ": expected both input_bias and hidden_bias or neither, got only ",
              defined(input_bias) ? "input_bias" : "hidden_bias");
  if (defined(input_bias)) {
    for (const auto& [bias, name] : {std::pair{*input_bias, "input_bias"}, std::pair{*hidden_bias, "hidden_bias"}}) {
      TORCH_CHECK(bias.dim() == 1 && bias.size(0) == gates, cell.op, ": expected ", name, " of shape [", gates,
                  "], got ", bias.sizes());
      check_tensor(cell, bias, name);
    }
  }
  const std::vector<int64_t> state = {input_gates.size(0), gates / factor};
  TORCH_CHECK(prev.sizes() == c10::IntArrayRef(state), cell.op, ": expected ", prev_name, " of shape ",
              c10::IntArrayRef(state), ", got ", prev.sizes());
  check_tensor(cell, prev, prev_name);
}

Tensor host(const Tensor& t, const Cell& cell) { return t.cpu().to(compute_type(cell.dtype)); }
Tensor back(const Tensor& t, const Cell& cell) { return t.to(cell.device, cell.dtype); }

// input_gates + hidden_gates + biases, on the host in the compute type.
Tensor gate_sum(const Cell& cell, const Tensor& input_gates, const Tensor& hidden_gates,
                const std::optional<Tensor>& input_bias, const std::optional<Tensor>& hidden_bias) {
  Tensor sum = host(input_gates, cell) + host(hidden_gates, cell);
  if (defined(input_bias)) sum = sum + host(*input_bias, cell) + host(*hidden_bias, cell);
  return sum;
}

std::tuple<Tensor, Tensor, Tensor> fused_lstm_cell(const Tensor& input_gates, const Tensor& hidden_gates,
                                                   const Tensor& cx, const std::optional<Tensor>& input_bias,
                                                   const std::optional<Tensor>& hidden_bias) {
  const Cell cell = start("_thnn_fused_lstm_cell", input_gates, "input_gates");
  check_forward(cell, input_gates, hidden_gates, input_bias, hidden_bias, cx, "cx", 4);
  const auto gates = gate_sum(cell, input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1);
  const Tensor i = gates[0].sigmoid(), f = gates[1].sigmoid(), g = gates[2].tanh(), o = gates[3].sigmoid();
  const Tensor cy = f * host(cx, cell) + i * g;
  const Tensor hy = o * cy.tanh();
  return {back(hy, cell), back(cy, cell), back(at::cat({i, f, g, o}, 1), cell)};
}

std::tuple<Tensor, Tensor, Tensor> fused_lstm_cell_backward(const std::optional<Tensor>& grad_hy,
                                                            const std::optional<Tensor>& grad_cy, const Tensor& cx,
                                                            const Tensor& cy, const Tensor& workspace, bool has_bias) {
  if (!defined(grad_hy) && !defined(grad_cy)) return {};  // nothing flows back (as on CUDA)
  const Tensor& grad = defined(grad_hy) ? *grad_hy : *grad_cy;
  const Cell cell = start("_thnn_fused_lstm_cell_backward_impl", grad, defined(grad_hy) ? "grad_hy" : "grad_cy");
  TORCH_CHECK(grad.dim() == 2, cell.op, ": expected gradients of 2 dimensions [batch, hidden_size], got shape ",
              grad.sizes());
  const std::pair<const std::optional<Tensor>*, const char*> named[] = {
      {&grad_hy, "grad_hy"}, {&grad_cy, "grad_cy"}};
  for (const auto& [t, name] : named) {
    if (!defined(*t)) continue;
    TORCH_CHECK((*t)->sizes() == grad.sizes(), cell.op, ": expected ", name, " of shape ", grad.sizes(), ", got ",
                (*t)->sizes());
    check_tensor(cell, **t, name);
  }
  for (const auto& [t, name] : {std::pair{cx, "cx"}, std::pair{cy, "cy"}}) {
    TORCH_CHECK(t.sizes() == grad.sizes(), cell.op, ": expected ", name, " of shape ", grad.sizes(), ", got ",
                t.sizes());
    check_tensor(cell, t, name);
  }
  TORCH_CHECK(workspace.dim() == 2 && workspace.numel() == grad.numel() * 4, cell.op,
              ": expected the forward's workspace of shape [", grad.size(0), ", ", 4 * grad.size(1), "], got ",
              workspace.sizes());
  check_tensor(cell, workspace, "workspace");

  const auto saved = host(workspace, cell).reshape({grad.size(0), 4 * grad.size(1)}).chunk(4, 1);
  const Tensor &i = saved[0], &f = saved[1], &g = saved[2], &o = saved[3];
  const Tensor tanh_cy = host(cy, cell).tanh();
  // hy = o * tanh(cy), cy = f * cx + i * g; an absent gradient is zero.
  Tensor grad_o, grad_c;
  if (defined(grad_hy)) {
    const Tensor go = host(*grad_hy, cell);
    grad_o = go * tanh_cy;
    grad_c = go * o * (1 - tanh_cy * tanh_cy);
    if (defined(grad_cy)) grad_c = grad_c + host(*grad_cy, cell);
  } else {
    grad_o = at::zeros_like(tanh_cy);
    grad_c = host(*grad_cy, cell);
  }
  const Tensor grad_gates = at::cat({grad_c * g * (1 - i) * i, grad_c * host(cx, cell) * (1 - f) * f,
                                     grad_c * i * (1 - g * g), grad_o * (1 - o) * o},
                                    1)
                                .to(cell.dtype);
  // The bias gradient sums the gates' gradient as CUDA does: after rounding to the dtype.
  const Tensor grad_bias = has_bias ? grad_gates.sum(0).to(cell.device) : Tensor();
  return {grad_gates.to(cell.device), back(grad_c * f, cell), grad_bias};
}

std::tuple<Tensor, Tensor> fused_gru_cell(const Tensor& input_gates, const Tensor& hidden_gates, const Tensor& hx,
                                          const std::optional<Tensor>& input_bias,
                                          const std::optional<Tensor>& hidden_bias) {
  const Cell cell = start("_thnn_fused_gru_cell", input_gates, "input_gates");
  check_forward(cell, input_gates, hidden_gates, input_bias, hidden_bias, hx, "hx", 3);
  auto in = host(input_gates, cell).chunk(3, 1);
  auto hid = host(hidden_gates, cell).chunk(3, 1);
  if (defined(input_bias)) {
    const auto bi = host(*input_bias, cell).chunk(3), bh = host(*hidden_bias, cell).chunk(3);
    for (size_t k = 0; k < 3; ++k) {
      in[k] = in[k] + bi[k];
      hid[k] = hid[k] + bh[k];
    }
  }
  const Tensor r = (in[0] + hid[0]).sigmoid();
  const Tensor z = (in[1] + hid[1]).sigmoid();
  const Tensor n = (in[2] + r * hid[2]).tanh();
  const Tensor h = host(hx, cell);
  const Tensor hy = n + z * (h - n);
  return {back(hy, cell), back(at::cat({r, z, n, h, hid[2]}, 1), cell)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> fused_gru_cell_backward(const Tensor& grad_hy,
                                                                           const Tensor& workspace, bool has_bias) {
  const Cell cell = start("_thnn_fused_gru_cell_backward", grad_hy, "grad_hy");
  TORCH_CHECK(grad_hy.dim() == 2, cell.op, ": expected grad_hy of 2 dimensions [batch, hidden_size], got shape ",
              grad_hy.sizes());
  const std::vector<int64_t> expected = {grad_hy.size(0), 5 * grad_hy.size(1)};
  TORCH_CHECK(workspace.sizes() == c10::IntArrayRef(expected), cell.op, ": expected the forward's workspace of shape ",
              c10::IntArrayRef(expected), ", got ", workspace.sizes());
  check_tensor(cell, workspace, "workspace");

  const auto saved = host(workspace, cell).chunk(5, 1);
  const Tensor &r = saved[0], &z = saved[1], &n = saved[2], &h = saved[3], &hn = saved[4];
  const Tensor go = host(grad_hy, cell);
  // hy = n + z * (h - n), n = tanh(in + r * hn), r and z sigmoids.
  const Tensor grad_z = go * (h - n) * (1 - z) * z;
  const Tensor grad_n = go * (1 - z) * (1 - n * n);
  const Tensor grad_r = grad_n * hn * (1 - r) * r;
  const Tensor grad_input_gates = at::cat({grad_r, grad_z, grad_n}, 1).to(cell.dtype);
  const Tensor grad_hidden_gates = at::cat({grad_r, grad_z, grad_n * r}, 1).to(cell.dtype);
  Tensor grad_input_bias, grad_hidden_bias;
  if (has_bias) {
    grad_input_bias = grad_input_gates.sum(0).to(cell.device);
    grad_hidden_bias = grad_hidden_gates.sum(0).to(cell.device);
  }
  return {grad_input_gates.to(cell.device), grad_hidden_gates.to(cell.device), back(go * z, cell), grad_input_bias,
          grad_hidden_bias};
}

}  // namespace

void register_rnn_cells() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  library->impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward));
  library->impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  library->impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
}

}  // namespace torchbridge::sdk
