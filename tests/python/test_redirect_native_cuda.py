"""Redirection whose target is CUDA itself (TORCHBRIDGE_BACKEND=cuda on an NVIDIA machine): torch.cuda
stays torch's own, with only the device policy added. On the H200 run (2026-11-26) every corpus
program under the target cuda died in a RecursionError: the target-generic replacements of
torch.cuda called the target's device module, which was the namespace they had replaced.

This machine has no GPU, so torch.cuda's functions are stood in for by recording fakes (what a
GPU's torch.cuda would do with the device it is given), the backend factory answers a CUDA target,
and the device policy maps every CUDA index onto the one GPU of the machine, as resolve_device does
on a one-GPU machine. The replacements are installed through the Patcher exactly as enable() does."""

import pytest
import torch

from torchbridge.redirect import _cuda
from torchbridge.redirect._patcher import Patcher


class OneGpuPolicy:
    """The device policy of a machine with one GPU: every CUDA index wraps onto cuda:0."""
    target = "cuda"

    def resolve(self, device):
        if isinstance(device, int):
            device = f"cuda:{device}"
        device = torch.device(device)
        return torch.device("cuda", 0) if device.type == "cuda" else device


class FakeCudaTarget:
    device = torch.device("cuda", 0)


@pytest.fixture
def gpu_namespace(monkeypatch):
    """torch.cuda with recording fakes for what the tests call, then redirection's replacements."""
    received = []

    class device:  # torch.cuda.device's shape: a context manager over an index
        def __init__(self, device):
            self.idx = device.index if isinstance(device, torch.device) else device
            received.append(("device", device))

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            return False

    def set_device(device):
        received.append(("set_device", device))

    def get_device_name(device=None):
        received.append(("get_device_name", device))
        return "fake GPU"

    def memory_allocated(device=None):
        received.append(("memory_allocated", device))
        return 0

    def set_rng_state(new_state, device="cuda"):
        received.append(("set_rng_state", device))

    for name, fake in {"device": device, "set_device": set_device, "get_device_name": get_device_name,
                       "memory_allocated": memory_allocated, "set_rng_state": set_rng_state}.items():
        monkeypatch.setattr(torch.cuda, name, fake)
    monkeypatch.setattr(_cuda.BackendFactory, "create", staticmethod(lambda name: FakeCudaTarget()))
    namespace, target_type = _cuda.build(OneGpuPolicy())
    patcher = Patcher()
    for name, replacement in namespace.items():
        patcher.replace(torch.cuda, name, replacement)
    yield received, target_type, device
    patcher.restore_all()


def test_the_namespace_calls_torchs_own_functions_with_the_resolved_device(gpu_namespace):
    received, target_type, _ = gpu_namespace
    assert target_type == "cuda"
    assert torch.cuda.get_device_name(3) == "fake GPU"  # recursed before, never reaching torch's
    torch.cuda.set_device(1)
    torch.cuda.memory_allocated(device="cuda:2")
    torch.cuda.set_rng_state(torch.ByteTensor(8), "cuda:1")
    assert received == [("get_device_name", torch.device("cuda", 0)), ("set_device", torch.device("cuda", 0)),
                        ("memory_allocated", torch.device("cuda", 0)), ("set_rng_state", torch.device("cuda", 0))]


def test_the_device_scope_is_torchs_class_for_the_resolved_device(gpu_namespace):
    received, _, torchs_device_class = gpu_namespace
    with torch.cuda.device(5) as scope:
        assert isinstance(scope, torchs_device_class) and scope.idx == 0
    with torch.cuda.device(-1) as untouched:  # "leave the current device alone", as in torch
        assert untouched.idx == -1
    with torch.cuda.device_of(torch.zeros(2)) as of_a_cpu_tensor:  # not CUDA's: leaves the device alone
        assert isinstance(of_a_cpu_tensor, torch.cuda.device) and of_a_cpu_tensor.idx == -1
    assert received == [("device", torch.device("cuda", 0)), ("device", -1), ("device", -1)]


def test_what_takes_no_device_stays_torchs_own_object(gpu_namespace):
    """is_available, Stream, Event, streams and the rest are not replaced: torch's real ones answer."""
    namespace, _ = _cuda.build(OneGpuPolicy())
    assert set(namespace) <= {"device", "device_of", "set_device", "get_device_name", "get_device_capability",
                              "get_device_properties", "synchronize", "memory_allocated", "max_memory_allocated",
                              "memory_reserved", "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
                              "mem_get_info", "memory_summary", "memory_stats_as_nested_dict",
                              "reset_accumulated_memory_stats", "get_rng_state", "set_rng_state",
                              "current_stream", "default_stream"}
    assert "is_available" not in namespace and "Stream" not in namespace and "device_count" not in namespace
