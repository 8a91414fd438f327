"""The minimal device in plain C (examples/minimal_device/minimal_device.c, under 400 lines against
runtime.h alone) is a whole PyTorch device from Python: found through TORCHBRIDGE_DEVICE_PATH as a
vendor's library is, it trains a model to the same weights as the CPU, and torch's own device
features (generators, streams and events, memory statistics, the profiler) answer for it."""

import json
import os
import pathlib
import subprocess
import sys

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


CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def run_cli(*args, **env):
    return subprocess.run([CONSOLE_SCRIPT, *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TORCHBRIDGE_DEVICE_PATH=str(LIBRARY_DIR), **env))


# PyTorch has one PrivateUse1 slot: a vendor's device beside emu failed at once ("holds 'emu';
# cannot also register 'minimal'") unless the user knew to pass --isolate.
def test_validate_runs_two_sdk_devices_in_processes_of_their_own():
    result = run_cli("validate", "--model", "builtin:mlp", "--backends", "cpu,emu,minimal", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["valid"] and {"emu", "minimal"} <= {check["backend"] for check in report["checks"]}


def test_portability_trains_on_the_sdk_device_torchbridge_backend_names():
    result = run_cli("portability", "--steps", "20", "--json", TORCHBRIDGE_BACKEND="minimal")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["passed"] and report["training"]["backend"] == "minimal"
    assert {load["backend"] for load in report["loads"] if load["passed"]} == {"minimal", "cpu", "emu"}
    assert any(item.get("own_process") for item in report["hardware"])  # emu, in a child


# "acme2" passed TorchBridge's check and then torch's device-string parser refused it, with the
# PrivateUse1 slot already taken; "linalg" loaded but left torch.linalg in place (no device module,
# torch.manual_seed no longer seeding the device). Both are refused before anything registers.
def test_names_torch_cannot_hold_are_refused_before_registering(fresh_python):
    result = fresh_python("""
import torchbridge
for name in ("acme2", "linalg", "nn"):
    try:
        torchbridge.devices.load(name)
    except ValueError as error:
        print(name, "|", error)
print("loaded:", torchbridge.devices.loaded())
torchbridge.devices.load("minimal")
print("then:", torchbridge.devices.loaded())
""", env={"TORCHBRIDGE_DEVICE_PATH": str(LIBRARY_DIR)})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "acme2 | invalid device name 'acme2'" in lines[0] and "take no digits" in lines[0]
    assert lines[1].startswith("linalg | device name 'linalg' is taken: torch.linalg is torch's own module")
    assert lines[2].startswith("nn | device name 'nn' is taken")
    assert lines[3:] == ["loaded: None", "then: minimal"]
