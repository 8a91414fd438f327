"""The torch.<name> module of an SDK device answers what programs ask torch.cuda (name,
properties, memory statistics, the current stream), and nn.DataParallel spreads a batch over the
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
