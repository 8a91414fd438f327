"""The minimal device in plain C (examples/minimal_device/minimal_device.c, under 400 lines against
runtime.h alone) is a whole PyTorch device from Python: found through TORCHBRIDGE_DEVICE_PATH as a
vendor's library is, it trains a model to the same weights as the CPU, and torch's own device
features (generators, streams and events, memory statistics, the profiler) answer for it."""

import os
import pathlib

import pytest

LIBRARY_DIR = pathlib.Path(os.environ.get(
    "TORCHBRIDGE_MINIMAL_DEVICE_DIR", pathlib.Path(__file__).resolve().parents[2] / "build/examples/minimal_device"))

pytestmark = pytest.mark.skipif(not (LIBRARY_DIR / "libtorchbridge_device_minimal.so").exists(),
                                reason=f"the minimal device is not built in {LIBRARY_DIR} (scripts/test.sh builds it)")

TRAIN_ON_MINIMAL_AND_CPU = """
import json, torch, torchbridge
torchbridge.devices.load("minimal")

def train(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                torch.nn.Linear(32, 3)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inputs, labels = torch.randn(64, 8).to(device), torch.randint(0, 3, (64,)).to(device)
    for _ in range(20):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
    return torch.cat([p.detach().cpu().flatten() for p in model.parameters()])

on_device, on_cpu = train("minimal:1"), train("cpu")
x = torch.ones(1 << 20, device="minimal")  # 4 MiB
start, end = torch.Event("minimal", enable_timing=True), torch.Event("minimal", enable_timing=True)
start.record(); y = x * 2; end.record(); end.synchronize()
torch.minimal.manual_seed(3); first = torch.rand(4, device="minimal")
torch.minimal.manual_seed(3); second = torch.rand(4, device="minimal")
with torch.autograd.profiler.profile(use_device="minimal") as prof:
    (x + 1).sum().item()
print(json.dumps({
    "max_difference": (on_device - on_cpu).abs().max().item(),
    "device_count": torch.minimal.device_count(),
    "allocated": torch.accelerator.memory_allocated(0),
    "event_ms": start.elapsed_time(end), "doubled": bool((y == 2).all()),
    "reproducible": torch.equal(first, second),
    "profiled_add": any(e.key == "aten::add" for e in prof.key_averages()),
}))
"""


def test_a_device_written_in_c_trains_like_the_cpu(fresh_python):
    result = fresh_python(TRAIN_ON_MINIMAL_AND_CPU, env={"TORCHBRIDGE_DEVICE_PATH": str(LIBRARY_DIR)}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    found = json.loads(result.stdout.splitlines()[-1])
    assert found["max_difference"] <= 1e-5  # the same CPU kernels run on its memory, in place
    assert found["device_count"] == 2
    assert found["allocated"] >= 4 << 20  # x, 4 MiB, is alive on device 0
    assert found["event_ms"] >= 0 and found["doubled"]
    assert found["reproducible"] and found["profiled_add"]


def test_without_the_path_it_is_not_found_and_the_error_says_where_it_looked(fresh_python):
    result = fresh_python("import torchbridge; torchbridge.devices.load('minimal')",
                          env={"TORCHBRIDGE_DEVICE_PATH": ""})
    assert result.returncode != 0
    assert "minimal" in result.stderr and "TORCHBRIDGE_DEVICE_PATH" in result.stderr
