"""The torch.<name> module of an SDK device answers what programs ask torch.cuda (name,
properties, memory statistics and the per-process memory fraction, the current stream), and nn.DataParallel spreads a batch over the
device's devices where CUDA is unavailable. References: the C++ backend's description (the same
numbers `torchbridge info` prints), sizes of the tensors allocated, one device's training."""

import copy
import json

import pytest
import torch

import torchbridge
from torchbridge import _C

MIB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def emu():
    torchbridge.devices.load("emu")


@pytest.mark.parametrize("spelling", ["int", "str", "torch.device"])
def test_queries_answer_for_the_device_named(spelling):
    device = {"int": 1, "str": "emu:1", "torch.device": torch.device("emu", 1)}[spelling]
    described = json.loads(_C.lookup("emu").info_json(1))
    properties = torch.emu.get_device_properties(device)
    assert torch.emu.get_device_name(device) == properties.name == described["name"]
    assert properties.total_memory == described["total_memory_bytes"] == 1 << 30
    assert properties.multi_processor_count == 0  # emu reports none
    torch.emu.synchronize(1)
    torch.emu.empty_cache()
    before = torch.emu.memory_allocated(device)
    block = torch.empty(4 * MIB, dtype=torch.uint8, device="emu:1")
    assert torch.emu.memory_allocated(device) - before == 4 * MIB
    assert torch.emu.max_memory_allocated(device) >= torch.emu.memory_allocated(device)
    assert torch.emu.memory_reserved(device) >= torch.emu.memory_allocated(device)
    assert torch.emu.memory_stats(device)["allocated_bytes.all.current"] == torch.emu.memory_allocated(device)
    free, total = torch.emu.mem_get_info(device)
    assert total == 1 << 30 and free <= total - 4 * MIB
    assert torch.emu.current_stream(device).device == torch.device("emu", 1)
    del block
    torch.emu.reset_peak_memory_stats(device)
    assert torch.emu.max_memory_allocated(device) == torch.emu.memory_allocated(device) == before


@pytest.fixture
def uncapped():
    yield
    for index in range(torch.emu.device_count()):
        torch.emu.set_per_process_memory_fraction(1.0, index)


def test_memory_fraction_caps_the_process_as_torch_cudas_does(uncapped):
    total = torch.emu.get_device_properties(1).total_memory
    assert torch.emu.get_per_process_memory_fraction("emu:1") == 1.0
    torch.emu.empty_cache()
    torch.emu.set_per_process_memory_fraction(0.125, "emu:1")  # 128 MiB of 1 GiB
    assert torch.emu.get_per_process_memory_fraction(1) == 0.125 and torch.emu.get_per_process_memory_fraction(0) == 1
    held = torch.empty(100 * MIB, dtype=torch.uint8, device="emu:1")
    with pytest.raises(torch.OutOfMemoryError, match=f"fraction 0.125 caps this process at {total // 8} bytes"):
        torch.empty(40 * MIB, dtype=torch.uint8, device="emu:1")
    other = torch.empty(40 * MIB, dtype=torch.uint8, device="emu:0")  # device 0 has no cap
    del held
    room = torch.empty(120 * MIB, dtype=torch.uint8, device="emu:1")  # the cache is released to make room
    assert torch.emu.memory_reserved(1) <= total // 8
    del room, other


@pytest.mark.parametrize("fraction, error, message", [
    (1.5, ValueError, "memory fraction 1.5 is invalid: expected a number from 0 to 1"),
    (-0.5, ValueError, "memory fraction -0.5 is invalid"),
    (float("nan"), ValueError, "memory fraction nan is invalid"),
    ("0.5", TypeError, "fraction must be a number from 0 to 1, got '0.5'"),
    (True, TypeError, "fraction must be a number from 0 to 1, got True"),
])
def test_bad_memory_fractions_are_refused(uncapped, fraction, error, message):
    with pytest.raises(error, match=message):
        torch.emu.set_per_process_memory_fraction(fraction)
    assert torch.emu.get_per_process_memory_fraction() == 1.0


def test_bfloat16_support_is_what_the_device_reports():
    described = json.loads(_C.lookup("emu").info_json(0))
    assert torch.emu.is_bf16_supported() == ("bfloat16" in described["supported_dtypes"]) is True
    assert torch.emu.is_bf16_supported(including_emulation=False) is True  # in its "hardware"


def _train(model, steps=10):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.randn(16, 8, generator=torch.Generator().manual_seed(1)).to("emu:0")
    targets = torch.randn(16, 2, generator=torch.Generator().manual_seed(2)).to("emu:0")
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    return [p.detach().cpu() for p in model.parameters()]


def test_data_parallel_over_the_devices_trains_as_one_device():
    if torch.cuda.is_available():
        pytest.skip("DataParallel takes CUDA where it is available")
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    one_device = _train(copy.deepcopy(base).to("emu:0"))
    torch.emu.reset_peak_memory_stats(1)
    parallel = torch.nn.DataParallel(copy.deepcopy(base).to("emu:0"))
    assert parallel.device_ids == [0, 1]
    spread = _train(parallel)
    assert torch.emu.max_memory_allocated(1) > 0  # the replica on device 1 really ran
    for a, b in zip(one_device, spread):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
