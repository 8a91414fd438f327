"""torch.nn modules on an SDK device (emu) against the CPU: the ones that used to return wrong
numbers (nn.Bilinear, through out= views inside torch._trilinear), the recurrent ones that could not
run (the fused LSTM/GRU cells torch uses on every non-CPU device), and FractionalMaxPool, whose
random samples are drawn on the device. References are the CPU and the cells' documented math."""

import os
import subprocess
import sys

import pytest
import torch

import torchbridge

os.environ.setdefault("TORCHBRIDGE_EMU_GUARDED", "1")
torchbridge.devices.load("emu")
DEVICE = torch.device("emu:0")


def test_trilinear_from_the_issue_matches_the_cpu():
    torch.manual_seed(0)
    x1, x2, w = torch.randn(2, 3), torch.randn(2, 4), torch.randn(5, 3, 4)
    expected = torch._trilinear(x1, w, x2, [1, 3], [0], [1, 2], [2, 3])
    actual = torch._trilinear(x1.to(DEVICE), w.to(DEVICE), x2.to(DEVICE), [1, 3], [0], [1, 2], [2, 3])
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("batch", [(), (4,), (2, 3)])
def test_bilinear_forward_and_backward_match_the_cpu(batch):
    torch.manual_seed(1)
    cpu = torch.nn.Bilinear(3, 4, 5).double()
    dev = torch.nn.Bilinear(3, 4, 5).double().to(DEVICE)
    dev.load_state_dict(cpu.state_dict())
    x1, x2 = torch.randn(*batch, 3, dtype=torch.double), torch.randn(*batch, 4, dtype=torch.double)
    results = []
    for module, device in ((cpu, "cpu"), (dev, DEVICE)):
        a, b = x1.detach().to(device).requires_grad_(), x2.detach().to(device).requires_grad_()
        out = module(a, b)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=torch.double).view(out.shape).to(device))
        results.append([out, a.grad, b.grad, module.weight.grad, module.bias.grad])
    for expected, actual in zip(*results):
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-12, atol=1e-12)


RECURRENT = {
    "LSTM": lambda: torch.nn.LSTM(3, 4, num_layers=2),
    "LSTM_bidirectional_projected": lambda: torch.nn.LSTM(3, 4, bidirectional=True, proj_size=2, batch_first=True),
    "LSTM_no_bias": lambda: torch.nn.LSTM(3, 4, bias=False),
    "GRU": lambda: torch.nn.GRU(3, 4, num_layers=2, bidirectional=True),
    "GRU_no_bias_unbatched": lambda: torch.nn.GRU(3, 4, bias=False),
    "LSTMCell": lambda: torch.nn.LSTMCell(3, 4),
    "GRUCell": lambda: torch.nn.GRUCell(3, 4),
    "GRUCell_unbatched": lambda: torch.nn.GRUCell(3, 4, bias=False),
}
INPUT_SHAPES = {"GRU_no_bias_unbatched": (5, 3), "LSTMCell": (2, 3), "GRUCell": (2, 3), "GRUCell_unbatched": (3,),
                "LSTM_bidirectional_projected": (2, 5, 3)}


def _run_recurrent(name, device, dtype, create_graph):
    torch.manual_seed(2)
    module = RECURRENT[name]().to(dtype).to(device)
    torch.manual_seed(3)
    x = torch.randn(INPUT_SHAPES.get(name, (5, 2, 3)), dtype=dtype).to(device).requires_grad_()
    out = module(x)
    flat = []
    for item in out if isinstance(out, tuple) else (out,):
        flat.extend(item if isinstance(item, tuple) else (item,))
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=dtype).view(o.shape).to(device)).sum() for o in flat)
    wrt = [x] + list(module.parameters())
    grads = torch.autograd.grad(loss, wrt, create_graph=create_graph)
    second = []
    if create_graph:  # double backward goes through torch's differentiable cell backward
        second = torch.autograd.grad(sum(g.pow(2).sum() for g in grads), wrt, allow_unused=True)
    return [t.detach().cpu() for t in flat + list(grads) + [s for s in second if s is not None]]


@pytest.mark.parametrize("name", sorted(RECURRENT))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("create_graph", [False, True])
def test_recurrent_modules_match_the_cpu(name, dtype, create_graph):
    torchbridge.devices.reset_fallback_counts()
    actual = _run_recurrent(name, DEVICE, dtype, create_graph)
    expected = _run_recurrent(name, "cpu", dtype, create_graph)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12  # the fused cell sums gates in another order
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=tolerance, atol=tolerance)
    counts = torchbridge.devices.fallback_counts()
    fused = [op for op in counts if op.startswith("aten::_thnn_fused_")]
    assert fused, "the device path (torch's fused cells) was not taken"


def _lstm_reference(gates_in, gates_hidden, cx, b_in, b_hidden):
    gates = gates_in + gates_hidden + (b_in + b_hidden if b_in is not None else 0)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def _gru_reference(gates_in, gates_hidden, hx, b_in, b_hidden):
    if b_in is not None:
        gates_in, gates_hidden = gates_in + b_in, gates_hidden + b_hidden
    ir, iz, i_n = gates_in.chunk(3, 1)
    hr, hz, h_n = gates_hidden.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (i_n + r * h_n).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, h_n], 1)


@pytest.mark.parametrize("bias", [True, False])
def test_fused_cells_follow_the_cuda_contract_forward_and_backward(bias):
    """Outputs and workspace layout as CUDA's kernels define them; gradients against autograd
    through the cell's math, computed on the CPU in float64."""
    torch.manual_seed(4)
    batch, hidden = 3, 5
    for factor, fused, reference in ((4, torch.ops.aten._thnn_fused_lstm_cell, _lstm_reference),
                                     (3, torch.ops.aten._thnn_fused_gru_cell, _gru_reference)):
        gi, gh = torch.randn(batch, factor * hidden, dtype=torch.double), torch.randn(batch, factor * hidden,
                                                                                         dtype=torch.double)
        state = torch.randn(batch, hidden, dtype=torch.double)
        bi = torch.randn(factor * hidden, dtype=torch.double) if bias else None
        bh = torch.randn(factor * hidden, dtype=torch.double) if bias else None
        cpu_args = [t.requires_grad_() if t is not None else None for t in (gi, gh, state, bi, bh)]
        dev_args = [t.detach().to(DEVICE).requires_grad_() if t is not None else None for t in cpu_args]
        expected = reference(*cpu_args)
        actual = fused(*dev_args)
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.detach().cpu(), e.detach(), rtol=1e-12, atol=1e-12)
        # Gradients of the outputs (not the workspace, which autograd does not differentiate).
        weights = [torch.randn(e.shape, dtype=torch.double) for e in expected[:-1]]
        grads_e = torch.autograd.grad(expected[:-1], [t for t in cpu_args if t is not None], weights)
        grads_a = torch.autograd.grad(actual[:-1], [t for t in dev_args if t is not None],
                                      [w.to(DEVICE) for w in weights])
        for a, e in zip(grads_a, grads_e):
            torch.testing.assert_close(a.cpu(), e, rtol=1e-12, atol=1e-12)


def test_fused_lstm_cell_backward_when_only_one_output_is_used():
    """Only hy or only cy reaches the loss: the other gradient is absent (None), not zero-filled."""
    torch.manual_seed(5)
    host = [torch.randn(2, 8, dtype=torch.double), torch.randn(2, 8, dtype=torch.double),
            torch.randn(2, 2, dtype=torch.double)]
    for used in (0, 1):
        cpu = [t.clone().requires_grad_() for t in host]
        dev = [t.to(DEVICE).requires_grad_() for t in host]
        expected = torch.autograd.grad(_lstm_reference(*cpu, None, None)[used].sum(), cpu)
        actual = torch.autograd.grad(torch.ops.aten._thnn_fused_lstm_cell(*dev)[used].sum(), dev)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.cpu(), e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_cells_in_reduced_precision_compute_in_float(dtype):
    torch.manual_seed(6)
    gi, gh, cx = torch.randn(4, 16), torch.randn(4, 16), torch.randn(4, 4)
    # The reference rounds the inputs as the device sees them, computes in float64, rounds once.
    rounded = [t.to(dtype).double() for t in (gi, gh, cx)]
    expected = _lstm_reference(*rounded, None, None)
    actual = torch.ops.aten._thnn_fused_lstm_cell(*(t.to(dtype).to(DEVICE) for t in (gi, gh, cx)))
    for a, e in zip(actual, expected):
        assert a.dtype == dtype
        torch.testing.assert_close(a.cpu(), e.to(dtype), rtol=0, atol=0) if dtype == torch.float16 else \
            torch.testing.assert_close(a.cpu().double(), e, rtol=1e-2, atol=1e-2)


def _r(*shape, dtype=torch.float32):
    return torch.randn(shape).to(dtype).to(DEVICE)


@pytest.mark.parametrize("call, message", [
    (lambda: torch.ops.aten._thnn_fused_lstm_cell(_r(2, 8), _r(2, 8), _r(2, 3)), r"expected cx of shape \[2, 2\], got \[2, 3\]"),
    (lambda: torch.ops.aten._thnn_fused_lstm_cell(_r(2, 8), _r(2, 6), _r(2, 2)),
     r"expected hidden_gates of the shape of input_gates \[2, 8\], got \[2, 6\]"),
    (lambda: torch.ops.aten._thnn_fused_gru_cell(_r(2, 7), _r(2, 7), _r(2, 2)),
     r"input_gates' second dimension \(7\) must be 3 \* hidden_size"),
    (lambda: torch.ops.aten._thnn_fused_gru_cell(_r(2, 6), _r(2, 6), _r(2, 2), _r(6)),
     r"expected both input_bias and hidden_bias or neither, got only input_bias"),
    (lambda: torch.ops.aten._thnn_fused_lstm_cell(_r(2, 8), _r(2, 8), _r(2, 2, dtype=torch.double)),
     r"expected cx of dtype Float like the first argument, got Double"),
    (lambda: torch.ops.aten._thnn_fused_gru_cell(*(_r(2, n, dtype=torch.long) for n in (6, 6, 2))),
     r"input_gates must be float, double, half or bfloat16, got Long"),
    (lambda: torch.ops.aten._thnn_fused_gru_cell_backward(_r(2, 2), _r(2, 9), True),
     r"expected the forward's workspace of shape \[2, 10\], got \[2, 9\]"),
    (lambda: torch.ops.aten._thnn_fused_lstm_cell_backward_impl(_r(2, 2), None, _r(2, 2), _r(2, 3), _r(2, 8), True),
     r"expected cy of shape \[2, 2\], got \[2, 3\]"),
])
def test_fused_cells_reject_bad_arguments_naming_them(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


def test_recurrent_cells_in_strict_mode_name_the_operator():
    code = ("import torch, torchbridge; torchbridge.devices.load('emu');"
            "torch.nn.LSTMCell(3, 4).to('emu')(torch.randn(2, 3, device='emu'))")
    env = dict(os.environ, TORCHBRIDGE_SDK_STRICT="1")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0
    assert "has no native kernel for device 'emu'" in result.stderr
    assert "TORCHBRIDGE_SDK_STRICT=1" in result.stderr


@pytest.mark.parametrize("module", [torch.nn.FractionalMaxPool2d, torch.nn.FractionalMaxPool3d])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("training", [True, False])
def test_fractional_max_pool_with_device_drawn_samples_matches_the_cpu(module, dtype, training):
    """The module draws its random samples on the input's device; seeding both generators alike
    must give the CPU's result, forward and backward."""
    shape = (2, 3, 7, 6) if module is torch.nn.FractionalMaxPool2d else (2, 3, 7, 6, 5)
    x = torch.randn(shape, dtype=dtype)
    results = []
    for device in ("cpu", DEVICE):
        pool = module(2, output_ratio=0.5, return_indices=True).train(training)
        inp = x.detach().to(device).requires_grad_()
        torch.manual_seed(7)  # seeds the CPU and the SDK device
        out, indices = pool(inp)
        out.backward(torch.ones_like(out))
        results.append([out, indices, inp.grad])
    for a, e in zip(results[1], results[0]):
        torch.testing.assert_close(a.cpu(), e, rtol=0, atol=0)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
    lambda p: torch.optim.Adam(p, lr=0.1, fused=True),
    lambda p: torch.optim.AdamW(p, lr=0.1, amsgrad=True, foreach=True),
    lambda p: torch.optim.Adagrad(p, lr=0.1, fused=True),
    lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, foreach=True),
    lambda p: torch.optim.NAdam(p, lr=0.1, foreach=True),
], ids=["SGD_foreach", "SGD_fused", "Adam_fused", "AdamW_amsgrad_foreach", "Adagrad_fused", "RMSprop_foreach",
        "NAdam_foreach"])
def test_optimizer_steps_with_foreach_and_fused_kernels_match_the_cpu(make):
    """foreach and fused optimizers update lists of written tensors in place on the fallback."""
    results = []
    for device in ("cpu", DEVICE):
        torch.manual_seed(8)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).to(device)
        optimizer = make(model.parameters())
        torch.manual_seed(9)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(5, 4).to(device)).pow(2).sum().backward()
            optimizer.step()
        state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        results.append([t.detach().cpu() for t in list(model.parameters()) + state])
    for actual, expected in zip(results[1], results[0]):
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7)


def test_dropout_takes_torchs_device_path_and_is_a_valid_dropout():
    """On non-CPU devices torch's dropout uses native_dropout, which draws differently from the CPU
    path: the values differ from the CPU's, but it must still be a dropout with rate p."""
    torch.manual_seed(10)
    x = torch.randn(500, 100, device=DEVICE) + 3
    y = torch.nn.functional.dropout(x, 0.3, training=True)
    kept = (y != 0).cpu()
    torch.testing.assert_close(y.cpu()[kept], x.cpu()[kept] / 0.7)
    assert abs((1 - kept.float().mean().item()) - 0.3) < 0.01


def test_record_stream_is_recorded_by_the_caching_allocator():
    """torch implements Tensor.record_stream for CUDA only; SDK devices have it natively."""
    stream = torch.Stream(device=DEVICE)
    x = torch.ones(1024, device=DEVICE)
    x.record_stream(stream)
    # Another emu device's stream is taken, as CUDA's record_stream takes one (it was refused);
    # the allocator fences it on its own device. Another device type's is refused, naming both.
    x.record_stream(torch.Stream(device="emu:1"))
    with pytest.raises(RuntimeError, match=r"the tensor is on emu:0 but the stream on cpu"):
        x.record_stream(torch.Stream(device="cpu"))
    del x
    torch.accelerator.synchronize("emu:1")
    y = torch.ones(1024, device=DEVICE)
    assert torch.equal(y.cpu(), torch.ones(1024))


def test_an_operator_without_any_cpu_kernel_is_a_clear_error():
    with pytest.raises(NotImplementedError, match=r"aten::_fused_dropout has no kernel for device 'emu', and "
                                                  r"PyTorch has no CPU kernel.*Run this step on the CPU"):
        torch.ops.aten._fused_dropout(torch.ones(3, device=DEVICE), 0.5)
