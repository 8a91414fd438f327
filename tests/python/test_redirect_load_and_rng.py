"""torch.load and torch's device-module lookups under redirection, found running checkpoints
written on GPU machines and torch.random.fork_rng under `torchbridge run`. A checkpoint saved on a
GPU differs from one saved on the CPU only in each storage's location tag ("cuda:1"), which torch
writes through torch.serialization.location_tag; the tests write exactly that."""

import contextlib
import io

import pytest
import torch

import torchbridge  # noqa: F401  (registers emu's loader)
from torchbridge import redirect

WEIGHT = torch.arange(6.0).reshape(2, 3)


@pytest.fixture(autouse=True)
def always_disable():
    yield
    redirect.disable()


def saved_with_location(tag: str) -> bytes:
    """A state dict as torch.save writes it where every storage lives on device `tag`."""
    original_tag = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: tag
    try:
        buffer = io.BytesIO()
        torch.save({"weight": WEIGHT}, buffer)
    finally:
        torch.serialization.location_tag = original_tag
    return buffer.getvalue()


@pytest.fixture(scope="module")
def saved_on_cuda_1():
    """A state dict as torch.save writes it on a machine whose model lived on cuda:1."""
    return saved_with_location("cuda:1")


def load(data, *args, **kwargs):
    return torch.load(io.BytesIO(data), *args, **kwargs)["weight"]


# (map_location as the program passes it, the device it lands on with 2 emu devices)
MAP_LOCATIONS = [
    ("none", None, "emu:1"),
    ("string", "cuda", "emu:0"),
    ("indexed string", "cuda:0", "emu:0"),
    ("bytes", b"cuda:1", "emu:1"),
    ("torch.device", torch.device("cuda", 1), "emu:1"),
    ("dict naming the saved device", {"cuda:1": "cuda:0"}, "emu:0"),
    ("dict to the CPU", {"cuda:1": "cpu"}, "cpu"),
    ("dict not naming it (stays where saved)", {"cuda:7": "cuda:0"}, "emu:1"),
    ("callable returning None (stays where saved)", lambda storage, location: None, "emu:1"),
    ("callable moving the storage", lambda storage, location: storage.cuda(0), "emu:0"),
    ("callable keeping the CPU storage", lambda storage, location: storage, "cpu"),
]


@pytest.mark.parametrize("form,map_location,expected", MAP_LOCATIONS, ids=[m[0] for m in MAP_LOCATIONS])
@pytest.mark.parametrize("weights_only", [True, False])
def test_every_map_location_form_restores_a_gpu_checkpoint_on_the_target(saved_on_cuda_1, form, map_location,
                                                                           expected, weights_only):
    with redirect.redirected("emu"):
        as_keyword = load(saved_on_cuda_1, map_location=map_location, weights_only=weights_only)
        as_positional = load(saved_on_cuda_1, map_location, weights_only=weights_only)
    for weight in (as_keyword, as_positional):
        assert str(weight.device) == expected
        assert torch.equal(weight.cpu(), WEIGHT)


def test_with_the_cpu_as_the_target_every_form_restores_on_the_cpu(saved_on_cuda_1):
    with redirect.redirected("cpu"):
        for _, map_location, _ in MAP_LOCATIONS:
            weight = load(saved_on_cuda_1, map_location=map_location)
            assert weight.device.type == "cpu" and torch.equal(weight, WEIGHT)


def test_without_redirection_torch_refuses_the_gpu_checkpoint_as_before(saved_on_cuda_1):
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine restores it on its GPU")
    with pytest.raises(RuntimeError, match="CUDA"):
        load(saved_on_cuda_1)


# fork_rng as programs call it: the device type left to torch (2.11 and 2.12: "cuda"; 2.13: the
# current accelerator, else "cuda") or named.
FORK_RNG_DEVICE_TYPES = [{}, {"device_type": "cuda"}, {"device_type": "cuda:0"}]


@pytest.mark.parametrize("device_type", FORK_RNG_DEVICE_TYPES, ids=["default", "cuda", "cuda:0"])
@pytest.mark.parametrize("target", ["cpu", "emu"])
def test_fork_rng_restores_the_target_generators(target, device_type):
    # torch 2.13 finds the device's module through torch.get_device_module("cuda"); with the CPU as
    # the target that was torch.cpu, which has no get_rng_state (AttributeError). torch 2.11 and
    # 2.12 take getattr(torch, torch.device("cuda").type), torch.cpu as well (the corpus's
    # profile_and_resume.py on the H200, torch 2.11), which this torch cannot show.
    with redirect.redirected(target):
        torch.manual_seed(1)
        torch.cuda.manual_seed_all(1)
        expected = torch.rand(4, device="cuda").cpu()
        torch.manual_seed(1)
        torch.cuda.manual_seed_all(1)
        with torch.random.fork_rng(devices=[0], **device_type):
            torch.manual_seed(99)
            torch.cuda.manual_seed(99)
            inside = torch.rand(4, device="cuda").cpu()
        after = torch.rand(4, device="cuda").cpu()
    assert torch.equal(after, expected)
    assert not torch.equal(inside, expected)


@contextlib.contextmanager
def fork_rng_as_torch_2_11_looks_up_the_device(devices=None, enabled=True, _caller="fork_rng", _devices_kw="devices",
                                             device_type="cuda"):
    """torch 2.11's fork_rng reduced to its lookup, which this torch no longer has: the device's
    module is getattr(torch, torch.device(device_type).type)."""
    module = getattr(torch, torch.device(device_type).type)
    devices = list(range(module.device_count())) if devices is None else list(devices)
    cpu_state, device_states = torch.get_rng_state(), [module.get_rng_state(index) for index in devices]
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        for index, state in zip(devices, device_states):
            module.set_rng_state(state, index)


@pytest.mark.parametrize("target", ["cpu", "emu"])
def test_fork_rng_restores_the_generators_with_torch_2_11s_lookup(target, monkeypatch):
    monkeypatch.setattr(torch.random, "fork_rng", fork_rng_as_torch_2_11_looks_up_the_device)
    with redirect.redirected(target):
        torch.cuda.manual_seed(7)
        expected = torch.rand(3, device="cuda").cpu()
        torch.cuda.manual_seed(7)
        with torch.random.fork_rng(devices=[0]):
            torch.cuda.manual_seed(123)
            torch.rand(3, device="cuda")
        after = torch.rand(3, device="cuda").cpu()
    assert torch.equal(after, expected)


def test_get_device_module_answers_for_the_target_and_leaves_torch_cache_clean():
    with redirect.redirected("cpu"):
        assert torch.get_device_module("cuda") is torch.cuda  # its namespace answers for the CPU
        assert torch.get_device_module("cpu") is torch.cpu
    with redirect.redirected("emu"):
        assert torch.get_device_module("cuda") is torch.emu
        assert torch.get_device_module(torch.device("cuda:1")) is torch.emu
    assert torch.get_device_module("cuda") is torch.cuda


def test_a_checkpoint_saved_on_a_device_this_process_lacks_names_the_way_out():
    """A checkpoint saved on another PrivateUse1 device (an "npu:0" tag, or "emu:0" read where emu is
    not loaded) raised only c10's "Expected one of cpu, cuda, ..." (found 2026-11-29)."""
    saved = saved_with_location("npu:0")
    with redirect.redirected("cpu"):
        with pytest.raises(ValueError, match=r"a storage was saved on 'npu:0'.*pass map_location"):
            load(saved)
        assert torch.equal(load(saved, map_location="cpu"), WEIGHT)
