"""torch's profiler on an SDK device and under redirection. The device times come from the SDK's
profiler stubs (src/sdk/profiler_stubs.cpp): runtime events around every operator on the current
stream. Checked against what the emulated device is known to do: with TORCHBRIDGE_EMU_LATENCY_US
every queued stream operation waits that long before it runs, while the host goes on."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity

import torchbridge  # noqa: F401  (registers emu's loader)
from torchbridge import redirect
from torchbridge.redirect._profiler import redirect_activities

LATENCY_US = 20000

# zero_ queues a memset on the current stream and returns; its device time includes the memset's
# wait, its host time does not.
PROFILE_ZERO_FILL = """
import json, torch, torchbridge
torchbridge.devices.load("emu")
x = torch.empty(1 << 16, device="emu")
torch.emu.synchronize()
with torch.autograd.profiler.profile(use_device="emu") as prof:
    x.zero_()
    torch.emu.synchronize()
zero = next(e for e in prof.key_averages() if e.key == "aten::zero_")
print(json.dumps({"device_us": zero.device_time_total, "host_us": zero.cpu_time_total,
                  "device_type": str(zero.device_type), "zeros": bool((x == 0).all())}))
"""


def test_legacy_profiler_measures_device_time_with_the_runtime_events():
    result = subprocess.run([sys.executable, "-c", PROFILE_ZERO_FILL], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TORCHBRIDGE_EMU_LATENCY_US=str(LATENCY_US)))
    assert result.returncode == 0, result.stderr[-3000:]
    # Without the stubs torch fails in every profiler callback, saying so once per operator.
    assert "used in profiler but not enabled" not in result.stderr
    zero = json.loads(result.stdout.splitlines()[-1])
    assert zero["zeros"]
    assert zero["device_us"] >= LATENCY_US  # the memset waited on the device...
    assert zero["host_us"] < LATENCY_US  # ...while the host only queued it


def test_cuda_activity_becomes_the_target_activity():
    cuda, cpu, device = ProfilerActivity.CUDA, ProfilerActivity.CPU, ProfilerActivity.PrivateUse1
    assert redirect_activities([cpu, cuda], device) == [cpu, device]
    assert redirect_activities([cpu, cuda, device], device) == [cpu, device]  # no duplicate: torch refuses those
    assert redirect_activities([{cuda: ["mm"]}, cpu], device) == [{device: ["mm"]}, cpu]
    assert redirect_activities([cpu, cuda], None) == [cpu]  # the CPU target records host activity only
    assert redirect_activities([cuda], None) == [cpu]


@pytest.mark.parametrize("target", ["emu", "cpu"])
def test_profiling_a_cuda_program_under_redirection_records_without_failing(target, capfd):
    with redirect.redirected(target):
        x = torch.randn(32, 32, device="cuda")
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as kineto:
            (x @ x).sum().item()
        with torch.autograd.profiler.profile(use_cuda=True) as legacy:
            (x @ x).sum().item()
    assert ProfilerActivity.CUDA not in kineto.activities
    names = {event.key for event in legacy.key_averages()}
    assert "aten::mm" in names and "aten::mm" in {event.key for event in kineto.key_averages()}
    mm = next(event for event in legacy.key_averages() if event.key == "aten::mm")
    if target == "emu":
        assert mm.device_time_total > 0  # measured by the device's events
    else:
        assert mm.device_time_total == 0  # the CPU has no device time
    assert "used in profiler but not enabled" not in capfd.readouterr().err
