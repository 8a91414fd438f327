"""torchbridge.memory.offload_activations on emu, guarded (copies are real copies) and with an
artificial latency on every stream operation, so the copies really run behind the host and behind
each other: gradients and outputs must be bit-identical to no offload, saved activations must leave
the device, and what must stay (CPU tensors, parameters, small tensors) stays."""

import contextlib
import math
import os
import re
import time

os.environ["TORCHBRIDGE_EMU_GUARDED"] = "1"
os.environ["TORCHBRIDGE_EMU_LATENCY_US"] = "300"

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import torchbridge  # noqa: E402
from torchbridge._activation_offload import _Kept, _Offloaded  # noqa: E402
from torchbridge.memory import offload_activations  # noqa: E402

# CTest runs each file in its own process. In a shared pytest process another file may have
# loaded emu first, without the latency set above; the control below needs it.
LATENCY_APPLIES = not hasattr(torch, "emu")
torchbridge.devices.load("emu")
EMU = torch.device("emu:0")


def make_model(device):
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.2), nn.Linear(256, 256), nn.Tanh(),
                         nn.LayerNorm(256), nn.Linear(256, 16)).to(device).train()


def train_step(model, x, context):
    torch.manual_seed(9)
    with context:
        out = model(x)
    out.pow(2).sum().backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad.detach().cpu().clone() for p in trained] + [x.grad.detach().cpu().clone()]
    model.zero_grad(set_to_none=True)
    x.grad = None
    return out.detach().cpu(), grads


class Counting(offload_activations):
    """Counts the distinct tensors offloaded (a tensor several ops save is offloaded once) and the
    copies brought back, to show the path ran."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.records = {}  # id: record, kept alive so that ids stay distinct
        self.returned = 0

    @property
    def offloaded(self):
        return len(self.records)

    def _pack(self, tensor):
        packed = super()._pack(tensor)
        if isinstance(packed, _Offloaded):
            self.records[id(packed)] = packed
        return packed

    def _bring_back(self, record):
        self.returned += 1
        super()._bring_back(record)


@pytest.mark.parametrize("device", ["cpu", "emu"])
def test_gradients_are_bit_identical_to_no_offload(device):
    model = make_model(device)
    x = torch.randn(32, 64, device=device, requires_grad=True)
    import contextlib
    expected = train_step(model, x, contextlib.nullcontext())
    context = Counting(min_bytes=1024)
    actual = train_step(model, x, context)
    assert torch.equal(expected[0], actual[0])
    for i, (e, a) in enumerate(zip(expected[1], actual[1])):
        assert torch.equal(e, a), f"gradient {i} differs by {(e - a).abs().max().item()}"
    if device == "cpu":
        assert context.offloaded == 0  # CPU tensors are in host memory already
    else:
        # 6 saves, 5 distinct tensors: Tanh and LayerNorm save the same output, copied once.
        assert context.offloaded >= 5 and context.returned == context.offloaded


def test_parameters_small_tensors_and_a_second_backward():
    model = make_model(EMU)
    x = torch.randn(32, 64, device=EMU, requires_grad=True)
    context = Counting(min_bytes=32 * 256 * 4)  # only the [32, 256] activations qualify
    with context:
        out = model(x)
    assert 0 < context.offloaded <= 6  # never the weights, though Linear saves them
    loss = out.pow(2).sum()
    first = torch.autograd.grad(loss, x, retain_graph=True)[0].cpu()
    second = torch.autograd.grad(loss, x)[0].cpu()  # everything is brought back again from the host
    assert torch.equal(first, second)


def test_a_context_reused_every_step_holds_nothing_of_finished_steps():
    # Its table of saved tensors only grew: 4 entries a step, all dead after backward.
    model = make_model(EMU)
    context = offload_activations(min_bytes=0)
    for _ in range(20):
        with context:
            out = model(torch.randn(8, 64, device=EMU))
        assert len(context._saved) > 0
        out.pow(2).sum().backward()
        assert len(context._saved) == 0


def test_a_frozen_parameter_stays_on_the_device_while_the_activations_leave():
    # LoRA freezes its base weights. A frozen Linear saves weight.t(), a view of a leaf that does
    # not require grad, which was offloaded although the module holds the weight on the device.
    model = make_model(EMU)
    frozen = model[3].weight
    model[3].requires_grad_(False)
    x = torch.randn(32, 64, device=EMU, requires_grad=True)
    offloaded = []

    class Recording(Counting):
        def _pack(self, tensor):
            packed = super()._pack(tensor)
            if isinstance(packed, _Offloaded):  # by id: holding the tensor would keep it on the device
                offloaded.append(id(tensor if tensor._base is None else tensor._base))
            return packed

    import contextlib
    expected = train_step(model, x, contextlib.nullcontext())
    context = Recording(min_bytes=1024)
    actual = train_step(model, x, context)
    assert context.offloaded >= 4 and context.returned == context.offloaded  # the activations left
    assert id(frozen) not in offloaded
    assert torch.equal(expected[0], actual[0])
    for i, (e, a) in enumerate(zip(expected[1], actual[1])):
        assert torch.equal(e, a), f"gradient {i} differs by {(e - a).abs().max().item()}"


def test_the_saved_activations_leave_the_device():
    backend = torchbridge.BackendFactory.create("emu")
    model = make_model(EMU)
    x = torch.randn(512, 64, device=EMU, requires_grad=True)

    def held_after_forward(context):
        backend.synchronize()
        before = backend.get_memory_stats()["allocated_bytes"]
        with context:
            out = model(x)
        backend.synchronize()
        held = backend.get_memory_stats()["allocated_bytes"] - before
        out.sum().backward()
        model.zero_grad(set_to_none=True)
        x.grad = None
        return held

    import contextlib
    plain = held_after_forward(contextlib.nullcontext())
    offloaded = held_after_forward(offload_activations())
    # Without offload the device holds every saved [512, 256] activation (512 KiB each) and the
    # output; with it, only the output and what is below min_bytes.
    assert offloaded < 0.3 * plain, (plain, offloaded)


def test_the_host_copies_are_pinned_for_the_device_also_on_a_machine_with_cuda():
    """torch's pin_memory=True pins for CUDA whenever the machine has CUDA, even with emu as the
    process's accelerator, and emu copies CUDA's pinned memory as pageable memory, synchronously: on
    a GPU machine the offload's copies would never overlap anything (the likely reason the control
    below kept winning its race on the H200). The host copies must be pinned for emu itself."""
    hosts = []

    class Recording(offload_activations):
        def _pack(self, tensor):
            packed = super()._pack(tensor)
            if isinstance(packed, _Offloaded):
                hosts.append(packed.host)
            return packed

    model = make_model(EMU)
    x = torch.randn(32, 64, device=EMU, requires_grad=True)
    train_step(model, x, Recording(min_bytes=1024))
    assert hosts
    # is_pinned() asks the process's accelerator, emu, through torch's Context
    assert all(host.is_pinned() for host in hosts), f"{sum(h.is_pinned() for h in hosts)} of {len(hosts)} pinned"


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="min_bytes must be a non-negative int, got -1"):
        offload_activations(min_bytes=-1)
    with pytest.raises(ValueError, match="prefetch must be a non-negative int, got 1.5"):
        offload_activations(prefetch=1.5)


def test_a_device_off_the_accelerator_is_refused_naming_both():
    # meta is not this process's accelerator (emu is)
    x = torch.randn(512, 256, device="meta", requires_grad=True)
    with pytest.raises(RuntimeError, match=r"a saved tensor is on meta, but this process's accelerator is emu, and "
                                           r"offload runs on the accelerator's devices only"):
        with offload_activations():
            torch.tanh(x)


class LateIntoNaN(offload_activations):
    """Every copy back is as late and lands in memory as wrong as they can be: the side stream is
    held back by queued work before each copy, and the memory the copy lands in holds NaN. (With a
    fresh buffer, torch's caching allocator may hand back the very block the activation was
    offloaded from, still holding the right numbers; a 16-core machine did, and a compute stream
    that skipped the wait read them by luck.)"""

    def _device_buffer(self, record):
        buffer = super()._device_buffer(record).fill_(float("nan"))
        # The NaN is there before the copy is queued (the compute stream only: a device-wide
        # synchronize would also drain the side stream, and with it the copies queued there).
        torch.accelerator.current_stream(record.device).synchronize()
        return buffer

    # Device-to-device copies queued on the side stream ahead of each copy back, asynchronous to
    # the host (emu runs compute on the host but copies on its stream workers): 4 of 4 MiB, a few ms.
    ballast_copies, ballast_elements = 4, 1 << 20

    def _side_waits_for_compute(self, device):
        side = super()._side_waits_for_compute(device)
        if not hasattr(self, "_ballast"):
            self._ballast = [torch.empty(self.ballast_elements, device=device) for _ in range(2)]
        with side:
            for _ in range(self.ballast_copies):
                self._ballast[0].copy_(self._ballast[1])
        return side


def test_a_late_copy_back_into_stale_memory_still_gives_identical_gradients():
    if not LATENCY_APPLIES:
        pytest.skip("emu was loaded by another test file in this process, without the artificial latency")
    model = make_model(EMU)
    x = torch.randn(32, 64, device=EMU, requires_grad=True)
    import contextlib
    expected = train_step(model, x, contextlib.nullcontext())
    actual = train_step(model, x, LateIntoNaN(min_bytes=1024))
    assert all(torch.equal(e, a) for e, a in zip(expected[1], actual[1]))


def side_stream_seconds_per_copy(elements):
    """How long one device-to-device copy of `elements` floats keeps an emu side stream busy here."""
    side, a, b = torch.Stream(device=EMU), torch.empty(elements, device=EMU), torch.empty(elements, device=EMU)
    side.synchronize()
    start = time.perf_counter()
    with side:
        for _ in range(8):
            a.copy_(b)
    side.synchronize()
    return (time.perf_counter() - start) / 8


def test_without_the_wait_for_the_copy_back_the_gradients_are_wrong():
    """The control for the test above: a compute stream that does not wait for the copy back reads
    the device buffer before the data is there, so that test would catch a missing wait."""
    if not LATENCY_APPLIES:
        pytest.skip("emu was loaded by another test file in this process, without the artificial latency")

    class NoWait(LateIntoNaN):
        def __init__(self, ballast_copies, **kwargs):
            super().__init__(**kwargs)
            self.ballast_copies, self.ballast_elements = ballast_copies, 1 << 20
            self.there_when_read, self.pinned = [], []

        def _compute_waits_for(self, record):  # not waited for: only noted, for the message
            self.there_when_read.append(record.arrived.query())
            # An unpinned host copy would make the copy back blocking, hence never late.
            self.pinned.append(record.host.is_pinned())

    import contextlib
    model = make_model(EMU)
    x = torch.randn(32, 64, device=EMU, requires_grad=True)
    expected = train_step(model, x, contextlib.nullcontext())
    start = time.perf_counter()
    train_step(model, x, contextlib.nullcontext())  # timed warm: a first step's start-up costs would oversize it
    step_seconds = time.perf_counter() - start
    # The control must lose the race on any machine, so the side-stream work queued ahead of each
    # copy back is sized here, to 10 whole steps: a fixed amount (4, then 16 copies of 4-16 MiB)
    # was enough on the 2-core VM but not on the H200's 16-core host, where every copy had landed.
    ballast_copies = min(4096, max(4, math.ceil(10 * step_seconds / side_stream_seconds_per_copy(1 << 20))))
    for attempt in range(3):
        context = NoWait(ballast_copies, min_bytes=1024)
        actual = train_step(model, x, context)
        assert not all(torch.equal(e, a) for e, a in zip(expected[1], actual[1])), \
            f"attempt {attempt}: right gradients without the wait; {sum(context.there_when_read)} of " \
            f"{len(context.there_when_read)} copies back had landed when backward read them (the side stream " \
            f"had {ballast_copies} copies of 4 MiB queued ahead of each, 10 steps' worth or at most 4096); " \
            f"{sum(context.pinned)} of {len(context.pinned)} host copies were pinned"


def test_a_saved_tensor_changed_in_place_afterwards_is_refused_as_torch_refuses_it():
    """Autograd does not check the version of a tensor that saved-tensor hooks hold, and the copy to
    the host runs behind later compute-stream work: a saved tensor changed in place after the forward
    pass gave gradients that depended on timing (22239 apart under latency), where torch refuses."""
    def run(context):
        a = torch.randn(256, 256, device=EMU, requires_grad=True)
        b = a * 2
        with context:
            d = b * b.exp()  # saves b
        b.add_(1)
        d.sum().backward()

    with pytest.raises(RuntimeError, match="modified by an inplace operation") as plain:
        run(contextlib.nullcontext())
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*is at version 1; expected version 0 "
                                           "instead \\(offload_activations saved it") as offloaded:
        run(offload_activations())
    assert "[256, 256]" in str(plain.value) and "[256, 256]" in str(offloaded.value)


class Packs(offload_activations):
    """Keeps what each saved tensor was packed as, to show which path ran."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.packed = []

    def _pack(self, tensor):
        self.packed.append(super()._pack(tensor))
        return self.packed[-1]


@pytest.mark.parametrize("case", ["cpu tensor", "small emu tensor", "emu parameter"])
def test_a_kept_tensor_changed_in_place_afterwards_is_refused_with_torchs_versions(case):
    """Tensors offload keeps (CPU ones, those below min_bytes, parameters) came back unchecked: one
    changed in place between forward and backward gave the gradient at its new value (that of
    sin at h + 1; a Linear's output gradient from the doubled weight) where torch refuses."""
    def run(context):
        torch.manual_seed(0)
        if case == "emu parameter":
            layer = nn.Linear(256, 256, bias=False).to(EMU)  # 256 KiB: kept for being a parameter, not for its size
            x = torch.randn(64, 256, device=EMU, requires_grad=True)
            with context:
                y = layer(x).sum()  # saves x and weight.t()
            with torch.no_grad():
                layer.weight.mul_(2)
        else:
            a = torch.randn(4, device="cpu" if case == "cpu tensor" else EMU, requires_grad=True)
            h = a * 2
            with context:
                y = h.sin().sum()  # saves h
            h.add_(1)
        y.backward()

    versions = r"is at version (\d+); expected version (\d+) instead"
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as plain:
        run(contextlib.nullcontext())
    context = Packs()
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*" + versions +
                                           " \\(offload_activations saved it for backward; change it after "
                                           "backward") as offloaded:
        run(context)
    assert context.packed and all(isinstance(packed, _Kept) for packed in context.packed)
    assert re.search(versions, str(offloaded.value)).groups() == re.search(versions, str(plain.value)).groups()


def test_kept_tensors_changed_only_after_backward_train_as_without_offload():
    """The version check of kept tensors must refuse nothing torch accepts: the optimizer changes the
    parameters in place after each backward, a tensor is saved by several ops and through views, one
    changed in place during the forward pass is saved at its new version, and double backward unpacks
    what was saved again."""
    def steps(context):
        torch.manual_seed(3)
        model = make_model(EMU)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        results = []
        for _ in range(3):
            x = torch.randn(32, 64, device=EMU, requires_grad=True)
            with context:
                h = model(x)
                h.tanh_()
                out = (h * h[:, :1]).sum() + (h.t() @ h).sum()
            (grad,) = torch.autograd.grad(out, x, create_graph=True)
            (out + grad.pow(2).sum()).backward()
            optimizer.step()
            optimizer.zero_grad()
            results += [out.detach().cpu(), x.grad.cpu()]
        return results + [p.detach().cpu() for p in model.parameters()]

    context = Packs()  # the default min_bytes: every tensor saved here is kept
    expected, actual = steps(contextlib.nullcontext()), steps(context)
    assert all(isinstance(packed, _Kept) for packed in context.packed)
    assert all(torch.equal(e, a) for e, a in zip(expected, actual))


def test_a_saved_view_comes_back_in_its_layout_for_bit_identical_double_backward():
    """Host copies of non-dense saved views were laid out row-major, and the copy back too: a
    transposed slice saved by mm came back with other strides, and double backward's kernels
    rounded differently (4096 apart of 3.9e10) where torch's save_on_cpu is bit-identical."""
    def step(context):
        torch.manual_seed(0)
        x = torch.randn(512, 64, device=EMU, requires_grad=True)
        with context:
            h = (x * 2).view(512, 1, 64).expand(512, 2, 64).reshape(512, 128)[:, 64:]
            out = (x * 3) @ h.t()[:, :10]  # saves the non-dense (64, 10) view with strides (1, 128)
        (grad,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        grad.pow(2).sum().backward()
        return x.grad.cpu()

    assert torch.equal(step(offload_activations(min_bytes=0)), step(contextlib.nullcontext()))


def step_peak_bytes(step):
    """The emu allocator's peak during ``step()`` above what was allocated before it."""
    backend = torchbridge.BackendFactory.create("emu")
    backend.synchronize()
    before = backend.get_memory_stats()["allocated_bytes"]
    backend.reset_peak_memory_stats()
    result = step()
    backend.synchronize()
    return backend.get_memory_stats()["peak_allocated_bytes"] - before, result


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_tensor_several_ops_save_is_offloaded_once_and_the_peak_stays_at_most_no_offloads(prefetch):
    """q, k and v projections each save the same hidden state. It was copied to the host once per
    saving op, and prefetch brought all the copies back at once: a step's peak rose above no
    offload's (+32 MiB of 97 with a 32 MiB hidden state, 145 MiB against 97 with six projections)."""
    def step(context):
        torch.manual_seed(0)
        x = torch.randn(2048, 256, device=EMU, requires_grad=True)
        weights = [torch.randn(256, 64, device=EMU, requires_grad=True) for _ in range(3)]

        def forward():
            with context:
                hidden = nn.functional.layer_norm(x, (256,))  # 2 MiB, held by nothing but autograd after this
                return sum((hidden @ w).sum() for w in weights)  # each mm saves `hidden`

        def forward_and_backward():
            forward().backward()
            return [t.grad.cpu() for t in (x, *weights)]

        return step_peak_bytes(forward_and_backward)

    plain_peak, expected = step(contextlib.nullcontext())
    context = Counting(prefetch=prefetch)
    peak, actual = step(context)
    assert all(torch.equal(e, a) for e, a in zip(expected, actual))
    hidden_bytes = 2048 * 256 * 4
    assert [r.host.numel() * r.host.element_size() for r in context.records.values()] == [hidden_bytes]
    assert context.returned == 1
    assert peak <= plain_peak, f"peak {peak / 2**20:.2f} MiB with offload, {plain_peak / 2**20:.2f} MiB without"
    # torch's save_on_cpu, for scale: it keeps the same tensors and peaks alike.
    save_on_cpu_peak, theirs = step(torch.autograd.graph.save_on_cpu())
    assert all(torch.equal(e, a) for e, a in zip(expected, theirs))
    assert peak <= save_on_cpu_peak + 4096


@pytest.mark.parametrize("storage_elements", [256, 1 << 15], ids=["1 KiB storage", "128 KiB storage"])
def test_a_broadcast_view_stays_on_the_device(storage_elements):
    """min_bytes counted a stride-0 view's shape (numel x element size): a broadcast of a 1 KiB
    tensor counted as 1 MiB, was copied to the host at that size and brought back as a dense 1 MiB
    tensor, so a step peaked above no offload's. What it holds on the device is its storage; and a
    broadcast of a storage of any size comes back larger than it was, so it stays."""
    rows = (1 << 20) // storage_elements  # the view spans 4 MiB either way

    def step(context):
        torch.manual_seed(0)
        x = torch.randn(rows, storage_elements, device=EMU, requires_grad=True)
        s = torch.randn(1, storage_elements, device=EMU, requires_grad=True)

        def forward_and_backward():
            with context:
                scale = torch.sigmoid(s)  # a small non-leaf
                loss = (x * scale.expand(rows, storage_elements)).sum()  # mul saves the stride-0 view
            loss.backward()
            return [x.grad.cpu(), s.grad.cpu()]

        return step_peak_bytes(forward_and_backward)

    plain_peak, expected = step(contextlib.nullcontext())
    context = Packs()
    peak, actual = step(context)
    assert all(torch.equal(e, a) for e, a in zip(expected, actual))
    expanded = [p for p in context.packed if isinstance(p, _Kept) and 0 in p.tensor.stride()]
    assert expanded, "the broadcast view was offloaded"
    assert not any(isinstance(p, _Offloaded) and p.host.numel() >= rows * storage_elements for p in context.packed)
    assert peak <= plain_peak, f"peak {peak / 2**20:.2f} MiB with offload, {plain_peak / 2**20:.2f} MiB without"


def test_min_bytes_and_prefetch_take_any_integer_as_checkpoint_sequential_does():
    import numpy as np

    context = offload_activations(min_bytes=np.int64(1024), prefetch=np.int32(1))
    assert (context.min_bytes, context.prefetch) == (1024, 1)
    assert type(context.min_bytes) is int and type(context.prefetch) is int
    for bad in (True, 1024.0, "1024", np.float64(1024)):
        with pytest.raises(ValueError, match=f"min_bytes must be a non-negative int, got {re.escape(repr(bad))}"):
            offload_activations(min_bytes=bad)


def test_a_saved_tensor_the_caller_still_holds_is_not_brought_back_beside_itself():
    """Copied back while the caller still held it (a hidden state kept for a loss term, logits),
    the tensor was twice on the device during backward: the step peaked 2 MiB above no offload."""
    def step(context):
        torch.manual_seed(0)
        x = torch.randn(2048, 256, device=EMU, requires_grad=True)
        w = torch.randn(256, 256, device=EMU, requires_grad=True)

        def forward_and_backward():
            with context:
                hidden = torch.tanh(x @ w)  # 2 MiB, saved by tanh and held by this frame
                loss = (hidden @ w).sum()
            loss.backward()
            return [x.grad.cpu(), w.grad.cpu(), hidden.detach().cpu()]

        return step_peak_bytes(forward_and_backward)

    plain_peak, expected = step(contextlib.nullcontext())
    context = Counting()
    peak, actual = step(context)
    assert all(torch.equal(e, a) for e, a in zip(expected, actual))
    assert context.offloaded >= 1 and context.returned == 0
    assert peak <= plain_peak, f"peak {peak / 2**20:.2f} MiB with offload, {plain_peak / 2**20:.2f} MiB without"
