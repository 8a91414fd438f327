"""Where an SDK device must behave as torch's own devices do, beyond what the OpInfo and module
sweeps sample: which device a grown storage lives on, a tensor that is both an input and the
output, operators reached through composites, mixed devices and generators, sparse COO in place,
DataParallel's first replica, byteswapped loads, pinned buffers reused for many copies. Every case
was a defect found by using emu as a user would (2026-11-27); each compares with the CPU or with
torch's documented behaviour."""

import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

import torchbridge

os.environ.setdefault("TORCHBRIDGE_EMU_GUARDED", "1")
torchbridge.devices.load("emu")


def storage_device(t: torch.Tensor) -> torch.device:
    return t.untyped_storage().device


@pytest.mark.parametrize("make", [
    lambda: torch.arange(10, device="emu:1"),
    lambda: torch.eye(3, device="emu:1"),
    lambda: torch.empty(0, device="emu:1").resize_(8),
    lambda: torch.add(torch.ones(4, device="emu:1"), 1, out=torch.empty(0, device="emu:1")),
    lambda: torch.cat([torch.ones(4, device="emu:1")] * 2, out=torch.empty(0, device="emu:1")),
], ids=["arange", "eye", "resize_", "add_out", "cat_out"])
def test_a_grown_storage_stays_on_its_tensors_device(make):
    # The allocator serves the current device (emu:0 here); a storage grown for a tensor on emu:1
    # used to move to emu:0, where a copy queued on emu:1 could race a new owner of the block.
    assert torch.emu.current_device() == 0
    t = make()
    assert t.device == storage_device(t) == torch.device("emu:1")
    buffer = io.BytesIO()
    torch.save(t, buffer)
    buffer.seek(0)
    assert torch.load(buffer).device == torch.device("emu:1")
    assert copy.deepcopy(t).device == torch.device("emu:1")


def test_a_storage_grown_while_another_device_is_current_stays_on_its_own():
    x = torch.empty(0, device="emu:0")
    with torch.emu.device(1):
        x.resize_(1000)
    assert storage_device(x) == torch.device("emu:0")


def on_both(fn):
    """fn(device) on the CPU and on emu: (result or the error's message) for each."""
    outcomes = []
    for device in ("cpu", "emu"):
        try:
            outcomes.append(fn(device))
        except RuntimeError as error:
            outcomes.append(f"RuntimeError: {error}".splitlines()[0])
    return outcomes


@pytest.mark.parametrize("operation", [
    lambda col, row: col.logical_or_(row),
    lambda col, row: col.logical_and_(row),
    lambda col, row: col.ldexp_(row),
    lambda col, row: torch.add(col, row, out=col),
    lambda col, row: torch.maximum(col, row, out=col),
], ids=["logical_or_", "logical_and_", "ldexp_", "add_out_self", "maximum_out_self"])
def test_an_output_that_is_also_an_input_is_not_broadcast_into(operation):
    # The CPU refuses to broadcast a [5, 1] view to [5, 5] in place. emu resized the view and
    # wrote 25 elements across the rows of its base.
    def run(device):
        base = torch.zeros(5, 6, device=device)
        try:
            operation(base[:, :1], torch.ones(1, 5, device=device))
        except RuntimeError as error:
            return str(error).splitlines()[0], base.cpu()
        return "no error", base.cpu()

    (cpu_message, cpu_base), (emu_message, emu_base) = run("cpu"), run("emu")
    assert "doesn't match the broadcast shape" in cpu_message
    assert emu_message == cpu_message
    assert torch.equal(emu_base, cpu_base)


def test_addr_in_place_on_a_0_dim_tensor_is_refused_and_computes_otherwise():
    cpu_error, emu_error = on_both(
        lambda d: torch.tensor(1.0, device=d).addr_(torch.ones(3, device=d), torch.ones(4, device=d)))
    assert "2D tensor expected" in cpu_error and emu_error == cpu_error
    u, v = torch.arange(3.0), torch.arange(4.0)
    m = torch.ones(3, 4, device="emu").addr_(u.to("emu"), v.to("emu"), beta=2, alpha=3)
    assert torch.equal(m.cpu(), torch.ones(3, 4).addr_(u, v, beta=2, alpha=3))


def test_conj_physical_in_place_matches_the_cpu():
    # Its composite calls a DispatchStub directly, which has no entry for the device: torch's
    # internal assertion "DispatchStub: missing kernel for emu".
    x = torch.tensor([1 + 2j, 3 - 4j])
    assert torch.equal(x.to("emu").conj_physical_().cpu(), x.clone().conj_physical_())


def test_copying_into_an_overlapping_destination_is_refused_as_on_the_cpu():
    def overlapping_source(device):
        x = torch.arange(10.0, device=device)
        return x[2:8].copy_(x[0:6]).cpu()

    def self_overlapping_destination(device):
        return torch.zeros(1, device=device).expand(3).copy_(torch.ones(3, device=device)).cpu()

    for case in (overlapping_source, self_overlapping_destination):
        cpu, emu = on_both(case)
        assert isinstance(cpu, str) and "memory location" in cpu
        assert emu == cpu
    x = torch.arange(10.0, device="emu")
    x.copy_(x)  # the same tensor: no overlap to refuse, as on the CPU
    assert torch.equal(x.cpu(), torch.arange(10.0))


@pytest.mark.parametrize("call", [
    lambda x, w, b: torch.nn.functional.conv2d(x.to("emu:0"), w.to("emu:1")),
    lambda x, w, b: torch.nn.functional.conv2d(x.to("emu:0"), w),
    lambda x, w, b: torch.nn.functional.conv2d(x.to("emu:0"), w.to("emu:0"), b),
    lambda x, w, b: torch.nn.functional.batch_norm(x.to("emu:0"), torch.zeros(3, device="emu:1"),
                                                   torch.ones(3, device="emu:1"), training=True),
    lambda x, w, b: torch.nn.functional.batch_norm(x.to("emu:0"), None, None, torch.ones(3), torch.zeros(3),
                                                   training=True),
], ids=["conv_weight_on_emu1", "conv_weight_on_cpu", "conv_bias_on_cpu", "bn_stats_on_emu1", "bn_affine_on_cpu"])
def test_convolution_and_batch_norm_refuse_tensors_on_two_devices(call):
    # They used to compute quietly across devices; backward then failed in autograd's own check.
    x, w, b = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.zeros(4)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        call(x, w, b)


def test_a_generator_of_another_device_type_is_refused_both_ways():
    with pytest.raises(RuntimeError, match="Expected a 'emu' device type for generator but found 'cpu'"):
        torch.randn(2, device="emu", generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'emu'"):
        torch.randn(2, generator=torch.Generator(device="emu").manual_seed(1))
    with pytest.raises(RuntimeError, match=r"emu:5.*2 device\(s\), valid indices 0\.\.1"):
        torch.Generator(device="emu:5")
    g = torch.Generator(device="emu:1").manual_seed(3)
    drawn = torch.randn(4, device="emu:1", generator=g).cpu()
    assert torch.equal(drawn, torch.randn(4, device="emu:1", generator=g.manual_seed(3)).cpu())
    # Offsets are for counter-based generators; the refusal used to name the "CPU Generator".
    with pytest.raises(NotImplementedError, match=r"a 'emu' generator has no offset to set to 4: .*get_state\(\) "
                                                  r"and set_state\(\)"):
        g.set_offset(4)
    # torch pickles and deep-copies a device generator through get_offset/set_offset, which raised.
    g.manual_seed(5)
    torch.randn(3, device="emu:1", generator=g)  # moves it past its seed
    for twin in (copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        assert twin.device == g.device and twin.initial_seed() == 5 and twin.get_offset() == 0
        assert torch.equal(torch.randn(4, device="emu:1", generator=twin).cpu(),
                           torch.randn(4, device="emu:1", generator=g.clone_state()).cpu())


@pytest.mark.parametrize("query", ["memory_allocated", "synchronize", "set_device", "get_device_name"])
def test_the_device_module_refuses_a_device_of_another_type(query):
    # torch.emu.memory_allocated("cpu") answered for the current emu device.
    with pytest.raises(ValueError, match="'cpu' is not a 'emu' device"):
        getattr(torch.emu, query)("cpu")
    assert torch.emu.current_device() == 0


def test_negative_seeds_are_taken_as_torch_takes_them():
    torch.manual_seed(-1)  # raised TypeError from the binding once emu was loaded
    assert torch.initial_seed() == torch.emu.initial_seed() == 2**64 - 1
    drawn = torch.randn(3, device="emu").cpu()
    torch.manual_seed(2**64 - 1)
    assert torch.equal(torch.randn(3, device="emu").cpu(), drawn)
    torch.emu.manual_seed(-(2**63))
    assert torch.emu.initial_seed() == 2**63
    with pytest.raises(RuntimeError, match="out of range"):
        torch.emu.manual_seed(2**64)


def coo():
    return torch.sparse_coo_tensor(torch.tensor([[0, 1, 2], [2, 0, 1]]), torch.tensor([3.0, 4.0, 5.0]), (3, 3))


@pytest.mark.parametrize("operation", [
    lambda s: s.mul_(3), lambda s: s.add_(s), lambda s: s.neg_(), lambda s: s.div_(2),
    lambda s: s.copy_(s * 2),
], ids=["mul_", "add_self", "neg_", "div_", "copy_"])
def test_sparse_coo_in_place_operators_match_the_cpu(operation):
    # Their write-back (a copy_ of a COO tensor from the CPU) was refused as a cross-device call.
    on_emu = coo().coalesce().to("emu")
    operation(on_emu)
    assert on_emu.device == torch.device("emu:0")
    assert torch.equal(on_emu.to_dense().cpu(), operation(coo().coalesce()).to_dense())


@pytest.mark.parametrize("make", [
    lambda: coo().to("emu:1"),
    lambda: torch.eye(3, device="emu:1").to_sparse(),
    lambda: torch.sparse_coo_tensor(coo()._indices().to("emu:1"), coo()._values().to("emu:1"), (3, 3)),
    lambda: torch.empty((3, 3), layout=torch.sparse_coo, device="emu:1"),
], ids=["to", "to_sparse", "from_members", "empty"])
def test_a_sparse_coo_tensor_builds_on_a_device_other_than_the_current_one(make):
    # torch's internal assertion "device() == values_.device()" before.
    assert torch.emu.current_device() == 0
    t = make()
    assert t.device == t._values().device == t._indices().device == torch.device("emu:1")


def test_data_parallel_keeps_the_first_replicas_buffer_updates():
    # torch documents that the replica on device_ids[0] shares the module's parameters and buffers,
    # so BatchNorm's running statistics move; the copies of every replica lost them.
    if torch.cuda.is_available():
        pytest.skip("DataParallel takes CUDA where it is available")
    torch.manual_seed(0)
    x = torch.randn(8, 3)
    bn = torch.nn.BatchNorm1d(3).to("emu:0")
    torch.nn.DataParallel(bn, device_ids=[0, 1])(x.to("emu:0"))
    reference = torch.nn.BatchNorm1d(3)
    reference(x[:4])  # replica 0's chunk
    torch.testing.assert_close(bn.running_mean.cpu(), reference.running_mean)
    torch.testing.assert_close(bn.running_var.cpu(), reference.running_var)
    assert bn.num_batches_tracked.item() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int16, torch.complex64, torch.bfloat16])
def test_byteswap_of_a_device_storage_matches_the_cpu(dtype):
    # torch swaps through the storage's pointer, which for device memory is no host memory: the
    # process died (SIGSEGV) in guarded mode.
    values = (torch.arange(6) * 1000 + 7).to(dtype)
    on_emu = values.to("emu").untyped_storage()
    on_emu.byteswap(dtype)
    on_cpu = values.clone().untyped_storage()
    on_cpu.byteswap(dtype)
    assert bytes(on_emu.cpu()) == bytes(on_cpu)


def test_a_big_endian_checkpoint_loads_onto_the_device_as_onto_the_cpu():
    # torch.load byteswaps each storage after placing it: with map_location="emu", on the device.
    weights = {"w": torch.randn(4, 5), "i": torch.arange(7, dtype=torch.int32)}
    written = io.BytesIO()
    torch.save(weights, written)
    big_endian = io.BytesIO()
    with zipfile.ZipFile(written) as source, zipfile.ZipFile(big_endian, "w") as target:
        for entry in source.infolist():
            data = source.read(entry)
            target.writestr(entry, b"big" if entry.filename.endswith("/byteorder") else data)
    big_endian.seek(0)
    on_cpu = torch.load(big_endian, map_location="cpu")
    big_endian.seek(0)
    on_emu = torch.load(big_endian, map_location="emu")
    assert not torch.equal(on_cpu["w"], weights["w"])  # the bytes were swapped: the test is live
    for name in weights:
        assert on_emu[name].device == torch.device("emu:0")
        assert torch.equal(on_emu[name].cpu(), on_cpu[name])


def test_a_pinned_buffer_reused_for_many_copies_holds_no_memory_per_copy():
    # Every non_blocking copy recorded an event on the pinned block, freed only with the block:
    # 60,000 copies from one staging buffer held 15.6 MiB (0.4 MiB now). A fresh process, so the
    # resident size measures this alone.
    program = textwrap.dedent("""
        import torch, torchbridge
        torchbridge.devices.load("emu")
        def resident_kib():
            return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])
        pinned = torch.ones(256).pin_memory()
        target = torch.empty(256, device="emu")
        for _ in range(1000):
            target.copy_(pinned, non_blocking=True)
        torch.emu.synchronize()
        before = resident_kib()
        for i in range(60000):
            target.copy_(pinned, non_blocking=True)
            if i % 1000 == 999:  # a stream worker that falls behind (a loaded machine) would hold the
                torch.emu.synchronize()  # queued copies themselves; the events of done ones are measured
        torch.emu.synchronize()
        assert torch.equal(target.cpu(), torch.ones(256))
        print((resident_kib() - before) / 1024)
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    grown_mib = float(result.stdout.strip().splitlines()[-1])
    assert grown_mib < 5, f"the process grew by {grown_mib:.1f} MiB over 60,000 copies"


def test_torch_accelerators_memory_api_serves_the_device_as_its_device_module_does():
    # torch.accelerator.empty_host_cache() read the host allocator torch keeps per device type,
    # which nothing had set for PrivateUse1: SIGSEGV. A fresh process, so a crash is reported.
    program = textwrap.dedent("""
        import torch, torchbridge
        torchbridge.devices.load("emu")
        pinned = torch.ones(1000).pin_memory()
        target = torch.empty(1000, device="emu")
        target.copy_(pinned, non_blocking=True)
        del pinned
        torch.accelerator.synchronize()
        torch.accelerator.empty_host_cache()
        torch.accelerator.empty_cache()
        assert torch.accelerator.memory_allocated() == torch.emu.memory_allocated() > 0
        assert torch.accelerator.memory_stats() == torch.emu.memory_stats()
        assert torch.equal(target.cpu(), torch.ones(1000))
        print("done")
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.split() == ["done"], (result.returncode, result.stderr)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "conv_transpose"])
def test_convolution_results_are_laid_out_as_torchs_fake_tensors_predict(dims, transposed):
    # torch.compile traces with fake tensors, which give a device like this one's convolutions a
    # contiguous result; the SDK kernel returned the CPU kernel's channels-last layout, and a
    # compiled CNN's flatten then failed ("view size is not compatible ...").
    from torch._subclasses.fake_tensor import FakeTensorMode
    torch.manual_seed(0)
    channels_last = {2: torch.channels_last, 3: torch.channels_last_3d}.get(dims, torch.contiguous_format)
    weight_shape = (3, 4) + (3,) * dims if transposed else (4, 3) + (3,) * dims
    weight = torch.randn(weight_shape).contiguous(memory_format=channels_last)
    source = torch.randn((2, 3) + (6,) * dims).contiguous(memory_format=channels_last)
    convolve = getattr(torch.nn.functional, f"conv_transpose{dims}d" if transposed else f"conv{dims}d")
    x = source.to("emu").requires_grad_()
    w = weight.to("emu").requires_grad_()
    fake = FakeTensorMode()
    fake_x, fake_w = fake.from_tensor(x), fake.from_tensor(w)
    with fake:
        predicted = convolve(fake_x, fake_w)
    result = convolve(x, w)
    assert result.stride() == predicted.stride()
    result.backward(torch.ones_like(result))
    x_cpu, w_cpu = source.clone().requires_grad_(), weight.clone().requires_grad_()
    convolve(x_cpu, w_cpu).backward(torch.ones_like(result.cpu()))
    torch.testing.assert_close(result.cpu(), convolve(source, weight))
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad)
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


def test_a_compiled_cnn_with_channels_last_weights_runs_on_the_device_as_on_the_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 16)).eval()
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 8, 8)
    expected = model(x)
    compiled = torch.compile(copy.deepcopy(model).to("emu"), backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x.to("emu")).cpu(), expected)


@pytest.mark.parametrize("make, shape", [(lambda: torch.nn.LayerNorm(64), (8, 16, 64)),
                                         (lambda: torch.nn.GroupNorm(4, 16), (4, 16, 8, 8))],
                         ids=["layer_norm", "group_norm"])
def test_normalizations_compute_the_cpus_bits_forward_and_backward(make, shape):
    # The device ran torch's generic composite (batch norm, then addcmul), which rounds differently
    # from the CPU's fused kernel: a ViT's layer norms were 4.8e-7 off the CPU, everything else exact.
    torch.manual_seed(0)
    module = make()
    torch.nn.init.normal_(module.weight)
    torch.nn.init.normal_(module.bias)
    on_device = copy.deepcopy(module).to("emu")
    x = torch.randn(shape, requires_grad=True)
    x_device = x.detach().to("emu").requires_grad_()
    gradient = torch.randn(shape)
    module(x).backward(gradient)
    result = on_device(x_device)
    result.backward(gradient.to("emu"))
    assert torch.equal(result.cpu(), module(x).detach())
    assert torch.equal(x_device.grad.cpu(), x.grad)
    assert torch.equal(on_device.weight.grad.cpu(), module.weight.grad)


def test_dropout_draws_from_the_devices_generator_as_on_torchs_own_devices():
    """native_dropout takes no generator argument, so through the CPU fallback it drew from the CPU's
    default generator (found 2026-11-28): torch.emu.manual_seed did not decide it, and it consumed
    the CPU's random numbers. Now the device's generator decides it; from a CPU generator in the same
    state, the CPU's own kernel gives the same output, mask and gradient."""
    x = torch.randn(4, 64, device="emu")

    def on_emu(cpu_seed, emu_seed):
        torch.manual_seed(cpu_seed)
        torch.emu.manual_seed(emu_seed)
        out = torch.nn.functional.dropout(x, 0.4)
        return out.cpu(), torch.rand(3)  # torch.rand(3): the CPU generator's next numbers

    first, cpu_next = on_emu(0, 5)
    assert torch.equal(first, on_emu(1, 5)[0])  # the CPU's seed does not matter
    assert not torch.equal(first, on_emu(0, 6)[0])  # the device's does
    torch.manual_seed(0)
    assert torch.equal(cpu_next, torch.rand(3))  # no CPU number was consumed

    for p, train in [(0.4, True), (1.0, True), (0.0, True), (0.4, False)]:
        leaf_emu = x.clone().requires_grad_()
        leaf_cpu = x.cpu().requires_grad_()
        torch.manual_seed(11)  # the same state in the CPU's generator and emu's
        out_emu, mask_emu = torch.native_dropout(leaf_emu, p, train)
        torch.manual_seed(11)
        out_cpu, mask_cpu = torch.native_dropout(leaf_cpu, p, train)
        assert torch.equal(out_emu.cpu(), out_cpu.detach()) and torch.equal(mask_emu.cpu(), mask_cpu), (p, train)
        assert mask_emu.dtype == mask_cpu.dtype == torch.bool
        out_emu.sum().backward()
        out_cpu.sum().backward()
        assert torch.equal(leaf_emu.grad.cpu(), leaf_cpu.grad), (p, train)
    empty_out, empty_mask = torch.native_dropout(torch.empty(0, 3, device="emu"), 0.5, True)
    cpu_out, cpu_mask = torch.native_dropout(torch.empty(0, 3), 0.5, True)
    assert empty_out.shape == cpu_out.shape and empty_mask.dtype == cpu_mask.dtype


VIEWS = {  # the same view of a [8, 8, 6] tensor, on either device: dense, permuted, strided, sliced
    "contiguous": lambda t: t,
    "permuted": lambda t: t.permute(2, 0, 1),
    "every_other": lambda t: t[:, ::2],
    "column": lambda t: t[:, :, 1],
    "channels_last": lambda t: t.reshape(2, 4, 8, 6).contiguous(memory_format=torch.channels_last),
}


@pytest.mark.parametrize("dtype", [None, torch.float64, torch.float16], ids=["same", "float64", "float16"])
@pytest.mark.parametrize("view", VIEWS)
def test_a_non_blocking_copy_to_the_cpu_lands_in_memory_pinned_for_the_device(view, dtype):
    """torch's _to_copy gives `.to("cpu", non_blocking=True)` from an accelerator a pinned result, so
    the copy can be queued; but ATen pins with CUDA's allocator wherever the process has CUDA, and
    the SDK copied into those blocks synchronously. The SDK's _to_copy pins with the device's own
    allocator (src/sdk/to_copy.cpp). On a machine with CUDA, is_pinned() (the device's view) was
    False before it; here, without CUDA, it holds either way, and the layout and values are checked
    against torch's CPU kernel on the same view."""
    source = torch.randn(8, 8, 6)
    reference = VIEWS[view](source).to(dtype=dtype, copy=True)  # torch's layout rule, on the CPU
    on_device = VIEWS[view](source.to("emu"))
    result = on_device.to("cpu", non_blocking=True, dtype=dtype)
    torch.emu.synchronize()  # a queued copy is read after the stream has run it, as with CUDA
    assert result.is_pinned()
    assert result.dtype == reference.dtype and result.stride() == reference.stride()
    assert torch.equal(result, reference)


def test_only_the_non_blocking_copy_to_the_cpu_is_pinned_as_torch_does():
    x = torch.randn(4, 5, device="emu", requires_grad=True)
    assert not x.to("cpu").is_pinned()  # blocking: pageable, as from CUDA
    explicit = x.to("cpu", non_blocking=True, memory_format=torch.contiguous_format)
    torch.emu.synchronize()
    assert explicit.is_pinned() and explicit.is_contiguous()
    explicit.sum().backward()  # the copy is differentiable as torch's own
    assert torch.equal(x.grad.cpu(), torch.ones(4, 5))


RACING_THREADS = textwrap.dedent("""
    import threading, torch, torchbridge
    torchbridge.devices.load("emu")
    wrong = []

    def copy_across(k):
        # x * 2 is a temporary copied to emu:1 (queued on emu:0's stream) and dropped at once.
        for it in range(800):
            n = 1000 + 37 * ((it + k) % 50)
            x = torch.arange(n, dtype=torch.float32, device="emu:0")
            if not torch.equal((x * 2).to("emu:1").cpu(), torch.arange(n, dtype=torch.float32) * 2):
                wrong.append(("copy", k, it))

    stop = False

    def zeros():
        while not stop:
            for n in (1000, 2000, 4000):
                torch.zeros(n, device="emu")  # dropped at once, its memset maybe still queued

    def double():
        for it in range(1500):
            if (torch.ones((1000, 2000, 4000)[it % 3], device="emu") * 2).min().item() != 2.0:
                wrong.append(("zeros", it))

    threads = [threading.Thread(target=copy_across, args=(k,)) for k in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    z, d = threading.Thread(target=zeros), threading.Thread(target=double)
    z.start(); d.start(); d.join(); stop = True; z.join()
    print(len(wrong), wrong[:3])
""")


@pytest.mark.parametrize("guarded", ["1", "0"])
def test_threads_sharing_a_device_never_get_each_others_numbers(guarded):
    """A block freed while work queued on its stream still used it (an asynchronous copy to another
    device, a memset) went at once to the next allocation, which another thread's CPU-fallback
    kernel then wrote from the host before the queued work ran (found 2026-11-29: 22 to 42 of 6,000
    results wrong guarded, up to 1,853 unguarded; the victim read another thread's numbers, or
    zeros). CUDA's allocator may hand such a block out at once because its next owner's kernels
    queue behind that work; host kernels do not, so the block now waits for its stream."""
    environment = {**os.environ, "TORCHBRIDGE_EMU_GUARDED": guarded}
    result = subprocess.run([sys.executable, "-c", RACING_THREADS], capture_output=True, text=True, timeout=600,
                            env=environment)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "0", f"results holding another thread's data: {result.stdout}"


def test_a_block_freed_while_its_stream_is_busy_waits_for_the_stream():
    """The deterministic side of the race above: with queued work slowed down, a block freed behind
    its stream's work is not handed out again until that work has run, then it is."""
    program = textwrap.dedent("""
        import torch, torchbridge
        torchbridge.devices.load("emu")
        warm = torch.zeros(4096, device="emu"); torch.emu.synchronize(); del warm
        a = torch.zeros(4096, device="emu")  # its memset queued, slowed by the emulated latency
        freed = a.data_ptr()
        del a
        b = torch.empty(4096, device="emu")
        print(b.data_ptr() != freed)
        torch.emu.synchronize()
        del b
        c = torch.empty(4096, device="emu")
        print(c.data_ptr() == freed)
        del c
        d = torch.zeros(4096, device="emu")  # queued again, and freed while queued
        del d
        torch.emu.synchronize()
        e = torch.empty(1, device="emu")  # the allocator looks again: the waiting free is done
        print(torch.emu.memory_stats()["active_bytes.all.current"] == 512)
    """)
    environment = {**os.environ, "TORCHBRIDGE_EMU_LATENCY_US": "200000"}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                            env=environment)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"], result.stdout


@pytest.mark.parametrize("source_shape", [(4,), (2, 3)])
def test_copy_into_an_empty_tensor_checks_the_shape_as_the_cpu_does(source_shape):
    """copy_ returned before checking the shapes when the destination had no elements, so a
    source that does not broadcast to it was accepted; the CPU refuses it."""
    messages = []
    for device in ("cpu", "emu"):
        with pytest.raises(RuntimeError) as refused:
            torch.empty(0, 3, device=device).copy_(torch.ones(source_shape, device=device))
        messages.append(str(refused.value))
    assert messages[0] == messages[1]


def test_copy_from_a_source_of_more_dimensions_names_the_broadcast_as_the_cpu_does():
    messages = []
    for device in ("cpu", "emu"):
        with pytest.raises(RuntimeError) as refused:
            torch.empty(3, device=device).copy_(torch.ones(1, 3, device=device))
        messages.append(str(refused.value))
    assert messages[0] == messages[1] == "output with shape [3] doesn't match the broadcast shape [1, 3]"


def test_set_with_a_storage_too_small_grows_it_as_the_cpu_does():
    results = []
    for device in ("cpu", "emu"):
        storage = torch.arange(4, dtype=torch.float32, device=device).untyped_storage()
        view = torch.empty(0, device=device).set_(storage, 2, (5,))
        results.append((view.shape, storage.nbytes(), view[:2].cpu().tolist()))
    assert results[0] == results[1] == (torch.Size([5]), 28, [2.0, 3.0])
    # A storage the call cannot take (another device) is refused by torch's own check, not grown first.
    other = torch.arange(4, dtype=torch.float32, device="emu:1").untyped_storage()
    with pytest.raises(RuntimeError, match="Attempted to set the storage of a tensor on device"):
        torch.empty(0, device="emu:0").set_(other, 2, (5,))
    assert other.nbytes() == 16


def test_the_device_module_has_torch_cudas_stream_and_event_api():
    """torch.emu lacked Stream, Event, stream(), default_stream and set_stream (found 2026-11-29),
    which code written for torch.cuda, and FSDP's device handle, call on a device's module."""
    side = torch.emu.Stream()
    assert isinstance(side, torch.Stream) and side.device == torch.device("emu:0")
    assert torch.emu.Stream(device=1).device == torch.device("emu:1")
    assert torch.emu.default_stream() == torch.accelerator.current_stream(0)
    done = torch.emu.Event(enable_timing=True)
    with torch.emu.stream(side):
        assert torch.emu.current_stream() == side
        result = torch.ones(8, device="emu") * 3
        done.record()
    assert torch.emu.current_stream() == torch.emu.default_stream()
    done.synchronize()
    assert torch.equal(result.cpu(), torch.full((8,), 3.0))
    torch.emu.set_stream(side)
    try:
        assert torch.emu.current_stream() == side
    finally:
        torch.emu.set_stream(torch.emu.default_stream())
    with torch.emu.stream(None):
        assert torch.emu.current_stream() == torch.emu.default_stream()
    # A stream of another device makes that device current for the block, then both come back, as
    # with torch.cuda.stream.
    other = torch.emu.Stream(device=1)
    with torch.emu.stream(other):
        assert torch.emu.current_device() == 1 and torch.emu.current_stream() == other
    assert torch.emu.current_device() == 0 and torch.emu.current_stream(1) == torch.emu.default_stream(1)
    with pytest.raises(ValueError, match="expected a stream of 'emu' or None, got one of cpu"):
        torch.emu.stream(torch.Stream(device="cpu"))


def test_device_events_time_and_record_as_torch_cuda_events_do():
    """torch.emu.Event was a subclass of torch.Event, and torch checks the exact type where an event
    is an argument: start.elapsed_time(end) and stream.record_event(event), CUDA's timing pattern,
    raised "expected other to be a torch.Event object" (found 2026-11-29)."""
    start, end = torch.emu.Event(enable_timing=True), torch.emu.Event(enable_timing=True)
    start.record()
    torch.ones(64, 64, device="emu") @ torch.ones(64, 64, device="emu")
    torch.emu.current_stream().record_event(end)
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    assert isinstance(start, torch.emu.Event) and isinstance(start, torch.Event)
    assert not isinstance(torch.Event("cpu"), torch.emu.Event)


def test_the_stream_api_refuses_what_is_not_a_stream_or_not_a_device():
    """stream("x") raised AttributeError, set_stream("x") pybind's "incompatible function
    arguments", and Stream(5) the runtime's "set_device failed" (found 2026-11-29)."""
    with pytest.raises(TypeError, match="torch.emu.stream: expected a torch.Stream or None, got str"):
        torch.emu.stream("x")
    with pytest.raises(TypeError, match="torch.emu.set_stream: expected a torch.Stream or None, got str"):
        torch.emu.set_stream("x")
    with pytest.raises(IndexError, match="device index 5 is out of range for 'emu' \\(2 devices\\)"):
        torch.emu.Stream(5)


@pytest.mark.parametrize("arguments", [(8,), (8, False), (8, True, 5.0)], ids=["length", "periodic", "beta"])
def test_kaiser_window_is_made_on_the_device_as_on_the_cpu(arguments):
    """torch.kaiser_window(device="emu") hit torch's internal assertion "DispatchStub: missing
    kernel for emu": its factory calls its kernel stub directly (found 2026-11-29)."""
    made = torch.kaiser_window(*arguments, device="emu", dtype=torch.float64)
    assert made.device.type == "emu"
    assert torch.equal(made.cpu(), torch.kaiser_window(*arguments, dtype=torch.float64))


WRITERS_OF_NEIGHBOURING_COLUMNS = textwrap.dedent("""
    import threading, torch, torchbridge
    torchbridge.devices.load("emu")
    x = torch.zeros(4000, 2, device="emu")
    def bump(column):
        for _ in range(100):
            x[:, column] += 1
    threads = [threading.Thread(target=bump, args=(c,)) for c in (0, 1)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(int((x.cpu() != 100).sum()))
""")


@pytest.mark.parametrize("guarded", ["1", "0"])
def test_writing_a_strided_view_leaves_the_bytes_between_its_elements_alone(guarded):
    """A view with holes (a column) was written back as its whole byte span, read before the kernel
    ran: another thread's writes to the holes in between were undone (found 2026-11-29: 7,998 of
    8,000 elements wrong guarded). Only the view's own elements are written now, as on the CPU."""
    result = subprocess.run([sys.executable, "-c", WRITERS_OF_NEIGHBOURING_COLUMNS], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "TORCHBRIDGE_EMU_GUARDED": guarded})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "0", f"elements that lost updates: {result.stdout}"


def test_a_strided_write_keeps_what_another_stream_wrote_between_its_elements():
    x = torch.ones(64, 2, 8, device="emu")
    side = torch.emu.Stream()
    with torch.emu.stream(side):
        x[32, 1, :] = 0  # bytes between the elements of x[:, 0, :], on another stream
    side.synchronize()
    x[:, 0, :].fill_(5)
    x[:, 0, :].mul_(2)
    expected = torch.ones(64, 2, 8)
    expected[32, 1, :] = 0
    expected[:, 0, :] = 10
    assert torch.equal(x.cpu(), expected)


def test_deterministic_mode_fills_new_device_memory_as_torch_fills_the_cpus():
    """torch.use_deterministic_algorithms(True) fills new memory with NaN (integers: their maximum)
    on the CPU and CUDA; emu gave back a reused block's old values."""
    torch.full((3,), 7.0, device="emu")  # leaves a cached block holding 7s
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        floats, ints = torch.empty(3, device="emu"), torch.empty(4, dtype=torch.int64, device="emu")
        strided = torch.empty_strided((2, 2), (1, 2), device="emu")
        grown = torch.zeros(2, device="emu").resize_(6)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert floats.cpu().isnan().all() and strided.cpu().isnan().all()
    assert ints.cpu().tolist() == [torch.iinfo(torch.int64).max] * 4
    assert grown.cpu()[:2].tolist() == [0.0, 0.0] and grown.cpu()[2:].isnan().all()


def test_a_0_dim_value_from_another_device_fills_and_index_puts_as_torch_allows():
    value = torch.tensor(2.5, device="emu:1")
    index = torch.tensor([0, 2])
    for target in (torch.zeros(3), torch.zeros(3, device="emu:0")):
        filled = target.clone().fill_(value)
        put = target.clone()
        put[index.to(put.device)] = value
        assert filled.cpu().tolist() == [2.5, 2.5, 2.5] and put.cpu().tolist() == [2.5, 0.0, 2.5]
    with pytest.raises(RuntimeError, match="fill_ only supports 0-dimension value tensor"):
        torch.zeros(3, device="emu").fill_(torch.ones(2, device="emu"))


def test_strided_nested_tensors_on_the_device_are_refused_naming_the_jagged_layout():
    nested = torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)])
    with pytest.raises(NotImplementedError, match="nested tensors of the strided layout .* layout=torch.jagged"):
        nested.to("emu")
    jagged = torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)], layout=torch.jagged, device="emu")
    assert torch.equal((jagged * 2).values().cpu(), torch.tensor([2.0, 2.0, 0.0, 2.0, 4.0]))


def test_set_rng_state_takes_a_byte_tensor_only_as_torch_does():
    state = torch.emu.get_rng_state()
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        torch.emu.set_rng_state(state.to(torch.int64))
    torch.emu.set_rng_state(state)
    first = torch.rand(3, device="emu")
    torch.emu.set_rng_state(state)
    assert torch.equal(torch.rand(3, device="emu"), first)


def test_a_strict_program_that_only_loads_the_device_exits_without_an_error():
    """The exit handler's probe backward used aten::mul, which has no kernel of emu's own: with
    TORCHBRIDGE_SDK_STRICT=1 every such program ended printing that the fallback was forbidden."""
    result = subprocess.run([sys.executable, "-c", "import torchbridge; torchbridge.devices.load('emu')"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TORCHBRIDGE_SDK_STRICT": "1"})
    assert result.returncode == 0 and "could not wait" not in result.stderr, result.stderr
