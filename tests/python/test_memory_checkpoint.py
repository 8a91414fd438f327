"""torchbridge.memory.checkpoint / checkpoint_sequential against torch.utils.checkpoint
(use_reentrant=False) and against no checkpointing, on the CPU and emu: same signature, bit-identical
outputs and gradients (dropout, autocast, kwargs, non-tensor outputs, torch.autograd.grad), and clear
errors for what is not supported."""

import inspect
import re

import numpy as np
import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

import torchbridge
from torchbridge.memory import checkpoint, checkpoint_sequential

torchbridge.devices.load("emu")

DEVICES = ["cpu", "emu"]


def make_model(device):
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.3), nn.LayerNorm(32), nn.Linear(32, 32),
                         nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 8)).to(device).train()


def seed(value):
    torch.manual_seed(value)  # seeds every device's generator, emu's too


def gradients(model, *tensors):
    grads = [p.grad.detach().cpu().clone() for p in model.parameters()]
    grads += [t.grad.detach().cpu().clone() for t in tensors]
    model.zero_grad(set_to_none=True)
    for t in tensors:
        t.grad = None
    return grads


def assert_identical(expected, actual):
    assert len(expected) == len(actual)
    for i, (e, a) in enumerate(zip(expected, actual)):
        assert torch.equal(e, a), f"gradient {i} differs by {(e - a).abs().max().item()}"


def run(model, x, wrap):
    seed(11)
    out = wrap(model, x)
    out.pow(2).sum().backward()
    return out.detach().cpu(), gradients(model, x)


# Ours is torch 2.14's signature; these are what it added to 2.11-2.13's (where preserve_rng_state
# came through **kwargs).
_ADDED_IN_TORCH_2_14 = {"preserve_rng_state", "respect_saved_tensors_hooks"}


def test_the_signatures_take_every_call_torchs_takes():
    ours, theirs = inspect.signature(checkpoint), inspect.signature(torch_checkpoint.checkpoint)
    for name, parameter in theirs.parameters.items():
        assert ours.parameters[name].kind == parameter.kind, name
        if parameter.default is not inspect.Parameter.empty:  # 2.14 made `function` optional
            assert ours.parameters[name].default == parameter.default, name
    assert set(ours.parameters) - set(theirs.parameters) <= _ADDED_IN_TORCH_2_14
    positional = [name for name, p in ours.parameters.items() if p.kind != inspect.Parameter.KEYWORD_ONLY]
    assert positional == [name for name, p in theirs.parameters.items() if p.kind != inspect.Parameter.KEYWORD_ONLY]
    assert list(inspect.signature(checkpoint_sequential).parameters) == \
        list(inspect.signature(torch_checkpoint.checkpoint_sequential).parameters)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_equal_torch_checkpoint_and_no_checkpoint_with_dropout(device):
    model = make_model(device)
    x = torch.randn(4, 16, device=device, requires_grad=True)
    plain = run(model, x, lambda m, v: m(v))
    theirs = run(model, x, lambda m, v: torch_checkpoint.checkpoint(m, v, use_reentrant=False))
    ours = run(model, x, lambda m, v: checkpoint(m, v, use_reentrant=False))
    assert torch.equal(plain[0], ours[0]) and torch.equal(theirs[0], ours[0])
    assert_identical(plain[1], ours[1])
    assert_identical(theirs[1], ours[1])


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_torchs_own_checkpoint_replays_the_sdk_devices_random_state(use_reentrant):
    """torch.utils.checkpoint saves and replays a device's random state only where torch.<device>
    says `_initialized` (torch.cuda's flag). torch.emu did not, so a checkpointed torch.rand on emu
    drew other numbers when recomputed, and the gradients were silently wrong."""
    w = torch.ones(8, device="emu", requires_grad=True)

    def region(v):
        return (v * torch.rand(8, device=v.device)).sum()

    def gradient(wrap):
        seed(3)
        wrap(w).backward()
        g, w.grad = w.grad.cpu().clone(), None
        return g

    plain = gradient(region)
    assert torch.equal(plain, gradient(lambda v: torch_checkpoint.checkpoint(region, v, use_reentrant=use_reentrant)))
    if not use_reentrant:
        assert torch.equal(plain, gradient(lambda v: checkpoint(region, v, use_reentrant=False)))


@pytest.mark.parametrize("device", DEVICES)
def test_no_input_requiring_grad_kwargs_and_non_tensor_outputs(device):
    model = make_model(device).eval()
    x = torch.randn(4, 16, device=device)

    def region(v, *, scale):
        hidden = model(v) * scale
        return {"hidden": hidden, "label": "logits", "index": hidden.argmax(1)}

    expected = region(x, scale=2.0)
    expected["hidden"].sum().backward()
    reference = gradients(model)
    out = checkpoint(region, x, scale=2.0, use_reentrant=False)
    assert out["label"] == "logits"
    assert torch.equal(out["index"], expected["index"]) and not out["index"].requires_grad
    assert out["hidden"].grad_fn.name() == "torchbridge::CheckpointBackward"
    out["hidden"].sum().backward()
    assert_identical(reference, gradients(model))


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_grad_and_nested_regions(device):
    model = make_model(device).eval()
    x = torch.randn(4, 16, device=device, requires_grad=True)
    weight = model[0].weight
    expected = torch.autograd.grad(model(x).sum(), [x, weight])

    def outer(v):
        return checkpoint(model, v, use_reentrant=False) * 1.5

    actual = torch.autograd.grad(checkpoint(outer, x, use_reentrant=False).sum() / 1.5, [x, weight])
    reference = torch.autograd.grad(outer(x).sum() / 1.5, [x, weight])
    for e, r, a in zip(expected, reference, actual):
        assert torch.equal(r.cpu(), a.cpu())
        torch.testing.assert_close(e.cpu(), a.cpu())
    assert x.grad is None and weight.grad is None


@pytest.mark.parametrize("nested", [False, True], ids=["one_region", "nested"])
@pytest.mark.parametrize("device", DEVICES)
def test_tensor_hooks_and_retain_grad_run_once_as_in_torchs_checkpoint(device, nested):
    # The nested backward once captured gradients at the outside tensors' own nodes, where autograd
    # runs their hooks before capturing; the outer pass ran them again (a doubling hook quadrupled).
    model = make_model(device).eval()
    leaf = torch.randn(4, 16, device=device, requires_grad=True)
    scale_leaf = torch.full((8,), 0.5, device=device, requires_grad=True)
    calls = {"weight": 0, "scale": 0}

    def counted(name, factor):
        def hook(grad):
            calls[name] += 1
            return grad * factor
        return hook

    model[0].weight.register_hook(counted("weight", 2))

    def run(wrap):
        calls.update(weight=0, scale=0)
        x = leaf * 1.5  # a non-leaf input
        x.retain_grad()
        scale = scale_leaf * 1.0  # captured by the region, not an input
        scale.register_hook(counted("scale", 3))

        def inner(v):
            return model(v) * scale

        if nested:
            y = wrap(lambda v: wrap(inner, v.sin()) + v.sum(), x)
        else:
            y = wrap(inner, x)
        y.pow(2).sum().backward()
        assert calls == {"weight": 1, "scale": 1}, calls
        return gradients(model, x, leaf, scale_leaf)

    expected = run(lambda f, v: f(v))
    assert_identical(expected, run(lambda f, v: torch_checkpoint.checkpoint(f, v, use_reentrant=False)))
    assert_identical(expected, run(lambda f, v: checkpoint(f, v, use_reentrant=False)))


@pytest.mark.parametrize("nested", [False, True], ids=["one_region", "nested"])
@pytest.mark.parametrize("device", DEVICES)
def test_a_second_order_gradient_through_a_region_equals_torchs(device, nested):
    # create_graph: the gradient's own graph runs through the recomputed nodes and must reach the
    # outside tensors (a penalty on the input gradient, as in WGAN-GP).
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device, requires_grad=True)
    x = torch.randn(3, 16, device=device, requires_grad=True)

    def run(wrap):
        def region(v):
            return torch.tanh(v @ w).pow(3)

        y = wrap(lambda v: wrap(region, v.sin()) * 2.0, x) if nested else wrap(region, x)
        grad_x, = torch.autograd.grad(y.sum(), x, create_graph=True)
        grad_x.pow(2).sum().backward()
        return [w.grad.cpu().clone(), x.grad.cpu().clone(), grad_x.detach().cpu()]

    expected = run(lambda f, v: f(v))
    w.grad = x.grad = None
    with_torchs = run(lambda f, v: torch_checkpoint.checkpoint(f, v, use_reentrant=False))
    w.grad = x.grad = None
    ours = run(lambda f, v: checkpoint(f, v, use_reentrant=False))
    assert_identical(with_torchs, ours)
    for e, a in zip(expected, ours):
        torch.testing.assert_close(e, a)


def test_the_random_state_of_a_device_tensor_inside_a_tuple_is_replayed():
    # torch's checkpoint finds the devices of tensors nested in its arguments; so must ours, or
    # dropout draws another mask when the region is recomputed.
    dropout = nn.Dropout(0.5)
    x = torch.randn(4096, device="emu", requires_grad=True)
    y = checkpoint(lambda pair: dropout(pair[0]) * pair[1], (x, 2.0), use_reentrant=False)
    y.sum().backward()
    assert torch.equal((y != 0).cpu(), (x.grad != 0).cpu())
    assert torch.equal(x.grad.cpu(), (y != 0).cpu().float() * 4.0)  # kept elements: 2 / (1 - 0.5) each


def test_an_input_inside_a_dict_changed_in_place_before_backward_is_refused():
    x = torch.randn(8, requires_grad=True)
    other = torch.randn(8)
    y = checkpoint(lambda d: (d["x"] * d["other"]).sum(), {"x": x, "other": other}, use_reentrant=False)
    other.add_(1.0)
    with pytest.raises(RuntimeError, match="input 1 was modified in place"):
        y.backward()


@pytest.mark.parametrize("device", DEVICES)
def test_recomputation_runs_under_the_forward_autocast(device):
    model = make_model(device).eval()
    x = torch.randn(4, 16, device=device, requires_grad=True)
    dtype = torch.bfloat16 if device == "cpu" else torch.float16

    def forward(wrap):
        with torch.autocast(device, dtype=dtype):
            out = wrap(x)
        out.float().sum().backward()  # outside autocast, as in a training loop
        return out.dtype, gradients(model, x)

    theirs = forward(lambda v: torch_checkpoint.checkpoint(model, v, use_reentrant=False))
    ours = forward(lambda v: checkpoint(model, v, use_reentrant=False))
    assert theirs[0] == ours[0] == dtype
    assert_identical(theirs[1], ours[1])


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_sequential_equals_torchs(device):
    model = make_model(device)
    x = torch.randn(4, 16, device=device, requires_grad=True)
    theirs = run(model, x, lambda m, v: torch_checkpoint.checkpoint_sequential(m, 3, v, use_reentrant=False))
    ours = run(model, x, lambda m, v: checkpoint_sequential(m, 3, v, use_reentrant=False))
    assert torch.equal(theirs[0], ours[0])
    assert_identical(theirs[1], ours[1])


@pytest.mark.parametrize("device", DEVICES)
def test_the_decorator_form_equals_the_direct_call(device):
    # torch 2.14's form: checkpoint(**options) returns a decorator; each call is one region.
    model = make_model(device)
    x = torch.randn(4, 16, device=device, requires_grad=True)
    direct = run(model, x, lambda m, v: checkpoint(m, v, use_reentrant=False))
    decorated = run(model, x, lambda m, v: checkpoint(use_reentrant=False, preserve_rng_state=True)(m)(v))
    assert torch.equal(direct[0], decorated[0])
    assert_identical(direct[1], decorated[1])


def test_unsupported_options_and_bad_input_are_clear_errors():
    model = make_model("cpu")
    x = torch.randn(2, 16)
    with pytest.raises(ValueError, match="use_reentrant=False only"):
        checkpoint(model, x, use_reentrant=True)
    with pytest.raises(NotImplementedError, match="context_fn"):
        checkpoint(model, x, context_fn=lambda: (None, None))
    # The FP8 record torch's checkpoint is given: these regions keep it already.
    model.eval()  # no dropout: the same output as the model's own
    assert torch.equal(checkpoint(model, x, use_reentrant=False, context_fn=torchbridge.fp8.checkpoint_contexts),
                       model(x))
    model.train()
    with pytest.raises(ValueError, match="determinism_check must be one of"):
        checkpoint(model, x, determinism_check="strict")
    with pytest.raises(ValueError, match=r"segments must be an int between 1 and the number of functions \(8\), got 9"):
        checkpoint_sequential(model, 9, x)
    # torch's words for a keyword it does not take (it was a TypeError), and any integer for segments.
    for sequential in (checkpoint_sequential, torch_checkpoint.checkpoint_sequential):
        with pytest.raises(ValueError, match="Unexpected keyword arguments: determinism_check"):
            sequential(model, 2, x, use_reentrant=False, determinism_check="none")
    outputs = []
    for sequential in (checkpoint_sequential, torch_checkpoint.checkpoint_sequential):
        torch.manual_seed(0)  # the model has dropout
        outputs.append(sequential(model, np.int64(2), x, use_reentrant=False))
    assert torch.equal(*outputs)
    with pytest.raises(TypeError, match="respect_saved_tensors_hooks must be None, True or False, got 'yes'"):
        checkpoint(model, x, respect_saved_tensors_hooks="yes")
    with pytest.raises(ValueError, match=r"keyword arguments \['scale'\] given without a function"):
        checkpoint(scale=2)
    with pytest.raises(ValueError, match="use_reentrant=False only"):
        checkpoint(use_reentrant=True)  # the decorator form checks its options when made
    with pytest.raises(TypeError, match="function must be callable, got Tensor"):
        checkpoint(x, x)


def test_a_region_nothing_in_it_trains_runs_with_a_warning_as_torchs_would_without():
    # Frozen layers and an input without grad: torch runs it; we run it too and say why it is useless.
    model = make_model("cpu").requires_grad_(False).eval()
    x = torch.randn(2, 16)
    with pytest.warns(UserWarning, match="none of the region's 1 tensor outputs requires grad"):
        y = checkpoint(model, x, use_reentrant=False)
    assert torch.equal(y, torch_checkpoint.checkpoint(model, x, use_reentrant=False))
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()


def test_offloading_the_state_of_parameters_off_the_accelerator_is_refused():
    from torchbridge.memory import OffloadedAdamW

    with pytest.raises(ValueError, match=r"the parameters are on meta, but this process's accelerator is emu, and "
                                         r"offload runs on the accelerator's devices only"):
        OffloadedAdamW(nn.Linear(2, 2, device="meta").parameters())


def test_offloaded_adam_refuses_what_torch_adam_refuses_and_bad_bucket_sizes():
    """A single tensor was taken as its rows and a non-leaf as a parameter: both trained nothing,
    silently. A bucket size of 2**70 reached pybind ("incompatible constructor arguments"), 1.7 was
    cut to one byte, and lr = nan set after construction made every parameter NaN."""
    from torchbridge.memory import OffloadedAdamW

    weight = nn.Linear(4, 4, bias=False).to("emu").weight
    with pytest.raises(TypeError, match=r"params should be an iterable of Tensors, got a single tensor "
                                        r"torch.emu.FloatTensor \[4, 4\]; pass \[tensor\]"):
        OffloadedAdamW(weight)
    with pytest.raises(ValueError, match=r"can't optimize a non-leaf Tensor \(parameter 1\)"):
        OffloadedAdamW([weight, weight * 1.0])
    with pytest.raises(ValueError, match=r"betas must be two numbers, got \(0.9,\)"):
        OffloadedAdamW([weight], betas=(0.9,))
    for size, error, words in ((2**70, ValueError, "must be positive and below 2\\*\\*63, got 1180591620717411303424"),
                               (0, ValueError, "must be positive"),
                               (1.7, TypeError, "must be an int number of bytes, got float 1.7"),
                               (True, TypeError, "must be an int number of bytes, got bool True")):
        with pytest.raises(error, match=f"OffloadedAdamW: bucket_bytes {words}"):
            OffloadedAdamW([weight], bucket_bytes=size)
    optimizer = OffloadedAdamW([weight], bucket_bytes=np.int64(4096))  # numpy's integers are integers
    with pytest.raises(ValueError, match="Invalid learning rate: nan"):
        optimizer.lr = float("nan")
    with pytest.raises(ValueError, match="Invalid learning rate: -0.1"):
        optimizer.param_groups[0]["lr"] = -0.1
    assert optimizer.lr == 1e-3


def test_an_error_while_recomputing_reaches_the_caller_of_backward():
    calls = []

    def flaky(v):
        calls.append(1)
        if len(calls) > 1:
            raise KeyError("missing on the second call")
        return v * 2

    y = checkpoint(flaky, torch.randn(3, requires_grad=True), use_reentrant=False)
    with pytest.raises(RuntimeError, match="recomputing the region raised.*missing on the second call"):
        y.sum().backward()


def test_an_input_changed_in_place_before_backward_is_refused():
    x = torch.randn(3, requires_grad=True)
    h = x * 1.0
    y = checkpoint(torch.sin, h, use_reentrant=False)
    h.add_(1)
    with pytest.raises(RuntimeError, match="input 0 was modified in place after the region's forward pass"):
        y.sum().backward()


class CountingCalls(nn.Module):
    """A module that counts its forward calls: 2 per training step when it is checkpointed."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        return self.inner(x)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_region_under_torch_compile_gives_the_gradients_of_eager_code(backend):
    """Dynamo traced into checkpoint and broke the graph at the C++ calls, so the tensors handed to
    the region were not those the compiled code returned: the loss did not require grad, or, with
    another term in it, the checkpointed layers got no gradient at all, silently."""
    torch._dynamo.reset()
    model, head = CountingCalls(make_model("cpu")), nn.Linear(16, 1)
    x = torch.randn(4, 16, requires_grad=True)

    def loss_of(region):
        return lambda t: region(model, t).pow(2).sum() + head(t).sum()

    def grads_of(function):
        seed(11)
        model.calls = 0
        function(x).backward()
        calls = model.calls
        return gradients(model, x) + gradients(head), calls

    plain, _ = grads_of(loss_of(lambda m, t: m(t)))
    theirs, _ = grads_of(torch.compile(loss_of(lambda m, t: torch_checkpoint.checkpoint(m, t, use_reentrant=False)),
                                       backend=backend))
    torch._dynamo.reset()
    ours, calls = grads_of(torch.compile(loss_of(lambda m, t: checkpoint(m, t, use_reentrant=False)), backend=backend))
    assert calls == 2  # the region ran, and was recomputed in backward
    assert_identical(theirs, ours)
    assert_identical(plain, ours)
    torch._dynamo.reset()
    # One graph cannot hold the region; fullgraph=True says why rather than tracing into it.
    whole = torch.compile(loss_of(lambda m, t: checkpoint(m, t, use_reentrant=False)), backend=backend, fullgraph=True)
    with pytest.raises(Exception, match="torchbridge.memory.checkpoint runs its function eagerly"):
        whole(x)
    torch._dynamo.reset()


def test_second_order_gradients_through_the_outputs_agree_to_rounding_and_first_order_ones_exactly():
    """What the module's docstring promises: a second backward that runs back through the region's
    outputs (here through dL/dy = 2y) reaches the region's one recomputing node, which sums its part
    of each gradient before handing it on, where torch's checkpoint keeps the region's graph and
    adds the same terms in another grouping: 3.7e-9 apart of 0.039, with first order bit-identical."""
    def second_order(wrap):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Sigmoid())
        x = torch.randn(3, 8, requires_grad=True)
        grad_x, = torch.autograd.grad(wrap(m, x).pow(2).sum(), x, create_graph=True)
        return [grad_x.detach(), *torch.autograd.grad(grad_x.pow(2).sum(), [x, *m.parameters()])]

    plain = second_order(lambda m, x: m(x))
    theirs = second_order(lambda m, x: torch_checkpoint.checkpoint(m, x, use_reentrant=False))
    ours = second_order(lambda m, x: checkpoint(m, x, use_reentrant=False))
    assert_identical(plain, theirs)
    assert torch.equal(ours[0], plain[0])  # first order
    for want, got in zip(plain[1:], ours[1:]):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)


# ---- optimizer-state offload ------------------------------------------------------------------

@pytest.mark.parametrize("offloaded_class, torch_class", [("OffloadedAdamW", torch.optim.AdamW),
                                                          ("OffloadedAdam", torch.optim.Adam)])
def test_offloaded_adam_trains_like_torchs_on_emu(offloaded_class, torch_class):
    import torchbridge.memory as memory

    def model():
        torch.manual_seed(4)
        return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).to("emu")

    reference, offloaded = model(), model()
    options = dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.05, amsgrad=True)
    theirs = torch_class(reference.parameters(), foreach=False, **options)
    ours = getattr(memory, offloaded_class)(offloaded.parameters(), bucket_bytes=4096, **options)
    for step in range(10):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step)).to("emu")
        for net, optimizer in ((reference, theirs), (offloaded, ours)):
            optimizer.zero_grad()
            net(x).pow(2).mean().backward()
            optimizer.step()
    # torch's Python optimizer and its C++ one order a few float operations differently.
    for expected, actual in zip(reference.parameters(), offloaded.parameters()):
        torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=1e-5, atol=1e-6)
    ours.lr = 0.0  # the host optimizers take the new rate: nothing moves any more
    before = [p.detach().cpu().clone() for p in offloaded.parameters()]
    offloaded(x).sum().backward()
    ours.step()
    assert all(torch.equal(b, p.cpu()) for b, p in zip(before, offloaded.parameters()))


def _adam_setup(amsgrad):
    import torchbridge.memory as memory

    def model():
        torch.manual_seed(6)
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to("emu")

    def train(net, optimizer, steps, first):
        for step in range(first, first + steps):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step)).to("emu")
            optimizer.zero_grad()
            net(x).pow(2).mean().backward()
            optimizer.step()

    options = dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.05, amsgrad=amsgrad)
    return memory, model, train, options


def test_parameters_written_after_the_optimizer_was_built_are_the_ones_updated():
    # The usual resume: build the optimizer, then load the weights. Each step used to start from
    # the master copies taken at construction, so the loaded weights were overwritten silently.
    memory, model, train, _ = _adam_setup(amsgrad=False)
    trained = {name: torch.randn_like(t) for name, t in model().state_dict().items()}
    reference, offloaded = model(), model()
    theirs = torch.optim.Adam(reference.parameters(), lr=1e-2, foreach=False)
    ours = memory.OffloadedAdam(offloaded.parameters(), lr=1e-2, bucket_bytes=256)
    pairs = ((reference, theirs), (offloaded, ours))
    for net, optimizer in pairs:
        net.load_state_dict(trained)  # in place: copy_ into each parameter
        train(net, optimizer, 1, 0)
        net[0].weight.data = net[0].weight.detach() * 0.5  # new data, not an in-place write
        with torch.no_grad():
            net[2].bias.clamp_(-0.1, 0.1)
        train(net, optimizer, 2, 1)
    for expected, actual in zip(reference.parameters(), offloaded.parameters()):
        torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=1e-5, atol=1e-6)

    offloaded[2].bias.data = torch.zeros(5, device="emu")
    with pytest.raises(ValueError, match=r"parameter 3 is now Float \[5\] on emu:0, but was Float \[4\] on emu:0"):
        ours.step()


@pytest.mark.parametrize("amsgrad", [False, True])
def test_state_dicts_cross_between_offloaded_and_torchs_adamw(amsgrad, tmp_path):
    memory, model, train, options = _adam_setup(amsgrad)
    reference, offloaded = model(), model()
    theirs = torch.optim.AdamW(reference.parameters(), foreach=False, **options)
    ours = memory.OffloadedAdamW(offloaded.parameters(), bucket_bytes=256, **options)
    train(reference, theirs, 3, 0)
    train(offloaded, ours, 3, 0)
    # Ours, through a file, into a torch AdamW over a copy of the model, and theirs into ours.
    torch.save(ours.state_dict(), tmp_path / "ours.pt")
    saved = torch.load(tmp_path / "ours.pt")
    assert set(saved["state"][0]) == {"step", "exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if amsgrad else set())
    for key, value in theirs.state_dict()["state"][0].items():
        torch.testing.assert_close(saved["state"][0][key], value.cpu(), rtol=1e-5, atol=1e-7)
    assert saved["param_groups"][0].keys() == theirs.state_dict()["param_groups"][0].keys()
    continued = model()
    continued.load_state_dict(offloaded.state_dict())
    torch_from_ours = torch.optim.AdamW(continued.parameters(), foreach=False, **options)
    torch_from_ours.load_state_dict(saved)
    resumed = model()
    resumed.load_state_dict(reference.state_dict())
    ours_from_torch = memory.OffloadedAdamW(resumed.parameters(), lr=0.5)  # the group's settings come with the state
    ours_from_torch.load_state_dict(theirs.state_dict())
    assert ours_from_torch.lr == options["lr"]
    for net, optimizer in ((reference, theirs), (continued, torch_from_ours), (resumed, ours_from_torch)):
        train(net, optimizer, 3, 3)
    for expected, a, b in zip(reference.parameters(), continued.parameters(), resumed.parameters()):
        torch.testing.assert_close(a.cpu(), expected.cpu(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.cpu(), expected.cpu(), rtol=1e-5, atol=1e-6)


def test_a_training_state_file_resumes_offloaded_and_torch_adamw_alike(tmp_path):
    from torchbridge.checkpoint import load_training_state, save_training_state

    memory, model, train, options = _adam_setup(amsgrad=False)
    reference, offloaded = model(), model()
    theirs = torch.optim.AdamW(reference.parameters(), foreach=False, **options)
    ours = memory.OffloadedAdamW(offloaded.parameters(), **options)
    train(reference, theirs, 2, 0)
    train(offloaded, ours, 2, 0)
    save_training_state(tmp_path / "ours.safetensors", offloaded, ours, step=2)
    save_training_state(tmp_path / "theirs.safetensors", reference, theirs, step=2)
    # Each file into the other kind of optimizer, over a fresh model.
    into_torch, into_ours = model(), model()
    torch_resumed = torch.optim.AdamW(into_torch.parameters(), foreach=False)
    ours_resumed = memory.OffloadedAdamW(into_ours.parameters())
    assert load_training_state(tmp_path / "ours.safetensors", into_torch, torch_resumed).step == 2
    assert load_training_state(tmp_path / "theirs.safetensors", into_ours, ours_resumed).step == 2
    for net, optimizer in ((reference, theirs), (into_torch, torch_resumed), (into_ours, ours_resumed)):
        train(net, optimizer, 2, 2)
    for expected, a, b in zip(reference.parameters(), into_torch.parameters(), into_ours.parameters()):
        torch.testing.assert_close(a.cpu(), expected.cpu(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.cpu(), expected.cpu(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"holds a AdamW optimizer but a OffloadedAdam \(Adam's state\) was given"):
        load_training_state(tmp_path / "ours.safetensors", model(), memory.OffloadedAdam(model().parameters()))


def test_a_state_dict_that_does_not_fit_is_refused_and_changes_nothing():
    memory, model, train, options = _adam_setup(amsgrad=True)
    net = model()
    ours = memory.OffloadedAdam(net.parameters(), **options)
    train(net, ours, 1, 0)
    before = ours.state_dict()
    other = torch.optim.Adam(model()[0].parameters(), amsgrad=True)  # 2 parameters, not 4
    cases = [
        (other.state_dict(), "the state is for 2 parameters; this optimizer has 4"),
        ({"state": {}}, "expected a dict with 'state' and 'param_groups'"),
        (torch.optim.AdamW(net.parameters()).state_dict(), "the state is AdamW's .*load it into OffloadedAdamW"),
        (torch.optim.Adam(net.parameters(), maximize=True).state_dict(), "maximize=True is not supported"),
    ]
    without_max = ours.state_dict()
    del without_max["state"][1]["max_exp_avg_sq"]
    cases.append((without_max, r"parameter 1's max_exp_avg_sq is None; expected a floating-point tensor of shape \(16,\)"))
    transposed = ours.state_dict()
    transposed["state"][0]["exp_avg"] = transposed["state"][0]["exp_avg"].t()
    cases.append((transposed, r"parameter 0's exp_avg is torch.float32 \(8, 16\); expected a floating-point tensor"))
    on_meta = ours.state_dict()
    on_meta["state"][3]["exp_avg_sq"] = torch.empty(4, device="meta")
    cases.append((on_meta, r"parameter 3's exp_avg_sq is torch.float32 \(4,\) on meta"))
    huge_step = ours.state_dict()
    huge_step["state"][0]["step"] = 2**63
    cases.append((huge_step, r"parameter 0's step is 9223372036854775808; expected a whole number >= 0"))
    bad_lr = ours.state_dict()
    bad_lr["param_groups"][0]["lr"] = float("inf")
    cases.append((bad_lr, "lr is inf; expected a finite number"))
    half_step = ours.state_dict()
    half_step["state"][2]["step"] = torch.tensor(1.5)
    cases.append((half_step, r"parameter 2's step is tensor\(1.5000\); expected a whole number >= 0"))
    for state, message in cases:
        with pytest.raises(ValueError, match=message):
            ours.load_state_dict(state)
        after = ours.state_dict()
        assert after["param_groups"] == before["param_groups"]
        assert all(torch.equal(after["state"][i][k], v) for i, entry in before["state"].items() for k, v in entry.items())
    # What C++ steps with is unchanged too: the next step matches an optimizer that saw no refusals.
    twin_net = model()
    twin = memory.OffloadedAdam(twin_net.parameters(), **options)
    train(twin_net, twin, 1, 0)
    train(net, ours, 1, 1)
    train(twin_net, twin, 1, 1)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(net.parameters(), twin_net.parameters()))


def test_param_groups_lr_writes_through_and_other_settings_refuse():
    memory, model, train, options = _adam_setup(amsgrad=False)
    net = model()
    ours = memory.OffloadedAdamW(net.parameters(), **options)
    for group in ours.param_groups:  # warm-up code written for torch.optim
        group["lr"] = 0.0
    assert ours.lr == 0.0 and ours.param_groups[0]["lr"] == 0.0
    before = [p.detach().cpu().clone() for p in net.parameters()]
    train(net, ours, 1, 0)
    assert all(torch.equal(b, p.cpu()) for b, p in zip(before, net.parameters()))
    with pytest.raises(TypeError, match=r"OffloadedAdamW.param_groups\[0\]\['eps'\] cannot be changed: only 'lr' can"):
        ours.param_groups[0]["eps"] = 1e-3
    # dict.update and setdefault skipped __setitem__: lr stayed, other keys were taken silently.
    ours.param_groups[0].update(lr=0.25)
    assert ours.lr == 0.25
    with pytest.raises(TypeError, match=r"\['betas'\] cannot be changed"):
        ours.param_groups[0].update({"betas": (0.5, 0.5)})
    with pytest.raises(TypeError, match=r"\['foo'\] cannot be changed"):
        ours.param_groups[0].setdefault("foo", 1)
    assert ours.param_groups[0].setdefault("lr", 9.0) == 0.25


@pytest.mark.parametrize("options, message", [
    ({"lr": -1.0}, "Invalid learning rate: -1.0"), ({"lr": float("nan")}, "Invalid learning rate: nan"),
    ({"eps": -1.0}, "Invalid epsilon value: -1.0"), ({"betas": (1.5, 0.9)}, "Invalid beta parameter at index 0: 1.5"),
    ({"betas": (0.9, 1.0)}, "Invalid beta parameter at index 1: 1.0"),
    ({"weight_decay": -1.0}, "Invalid weight_decay value: -1.0"),
])
def test_bad_hyperparameters_are_torchs_value_errors(options, message):
    memory, model, _, _ = _adam_setup(amsgrad=False)
    for torch_class, ours in ((torch.optim.Adam, memory.OffloadedAdam), (torch.optim.AdamW, memory.OffloadedAdamW)):
        with pytest.raises(ValueError, match=re.escape(message)):
            torch_class(model().parameters(), **options)
        with pytest.raises(ValueError, match=re.escape(message)):
            ours(model().parameters(), **options)


def test_zero_grad_in_place_takes_a_gradient_that_is_a_view():
    # DataParallel(gradient_as_bucket_view=True) makes gradients views of its buckets, which
    # detach_() refuses ("Can't detach views in-place"); torch.optim zeroes them.
    memory, model, _, _ = _adam_setup(amsgrad=False)
    net = model()
    ours = memory.OffloadedAdam(net.parameters())
    bucket = torch.ones(sum(p.numel() for p in net.parameters()), device=next(net.parameters()).device)
    offset = 0
    for p in net.parameters():
        p.grad = bucket[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    ours.zero_grad(set_to_none=False)
    assert all(p.grad is not None and p.grad._base is bucket for p in net.parameters())
    assert bool((bucket.cpu() == 0).all())


def test_offloading_parameters_on_the_cpu_is_refused():
    from torchbridge.memory import OffloadedAdamW

    with pytest.raises(ValueError, match="parameter 0 is on the CPU"):
        OffloadedAdamW(nn.Linear(2, 2).parameters())
    with pytest.raises(TypeError, match="parameter groups given as dicts are not supported"):
        OffloadedAdamW([{"params": nn.Linear(2, 2).to("emu").parameters()}])


def sparse_embedding_step(device):
    """A Linear over an nn.Embedding(sparse=True), after one backward: the embedding's weight (the
    third parameter) has a sparse gradient."""
    torch.manual_seed(0)
    linear, embedding = nn.Linear(4, 4).to(device), nn.Embedding(10, 4, sparse=True).to(device)
    linear(embedding(torch.tensor([1, 2], device=device))).sum().backward()
    return list(linear.parameters()) + list(embedding.parameters())


@pytest.mark.parametrize("offloaded_class", ["OffloadedAdam", "OffloadedAdamW"])
def test_a_sparse_gradient_is_refused_as_torchs_adam_refuses_it_before_anything_steps(offloaded_class):
    """An embedding with sparse=True gave torch's "copy_() between dense and sparse Tensors is not
    implemented!", naming neither the parameter nor the cause."""
    import torchbridge.memory as memory

    with pytest.raises(RuntimeError, match="does not support sparse gradients") as theirs:
        torch.optim.Adam(sparse_embedding_step("cpu")).step()
    parameters = sparse_embedding_step("emu")
    ours = getattr(memory, offloaded_class)(parameters, lr=0.1)
    before = [p.detach().cpu().clone() for p in parameters]
    torch_words = str(theirs.value).replace("Adam", offloaded_class.replace("Offloaded", ""), 1)
    with pytest.raises(RuntimeError, match=re.escape(torch_words) + f": {offloaded_class}'s parameter 2 "
                                           r"\[10, 4\] has a torch.sparse_coo gradient"):
        ours.step()
    assert all(torch.equal(b, p.detach().cpu()) for b, p in zip(before, parameters))
    assert ours.state_dict()["state"] == {}
