"""PyTorch's autograd serves one accelerator per process: TorchBridge refuses to put an SDK device
beside a native accelerator (docs/device-sdk.md). The GPU cases run where torch has CUDA
(scripts/gpu-check.sh); on any machine, loading emu must not warn when there is nothing to warn of."""

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def test_loading_emu_warns_only_when_a_native_accelerator_is_there(fresh_python):
    code = """
import warnings, torchbridge
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torchbridge.devices.load("emu")
print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
"""
    run = fresh_python(code)
    assert run.returncode == 0, run.stderr
    if HAS_CUDA:
        assert "one accelerator per process" in run.stdout and "cuda is available here" in run.stdout
    else:
        assert run.stdout.strip() == "[]"


@needs_cuda
def test_an_sdk_device_is_refused_once_cuda_is_in_use(fresh_python):
    code = """
import torch, torchbridge
torch.ones(2, device="cuda")
try:
    torchbridge.devices.load("emu")
except Exception as error:
    print(type(error).__name__, error)
print("loaded:", torchbridge.devices.loaded())
"""
    run = fresh_python(code)
    assert run.returncode == 0, run.stderr
    assert "one accelerator per process" in run.stdout and "device 0 has a CUDA context" in run.stdout
    assert "loaded: None" in run.stdout


@needs_cuda
def test_cuda_is_refused_once_an_sdk_device_is_loaded(fresh_python):
    code = """
import warnings, torchbridge
warnings.simplefilter("ignore")
torchbridge.devices.load("emu")
try:
    torchbridge.BackendFactory.create("cuda")
except Exception as error:
    print(type(error).__name__, error)
"""
    run = fresh_python(code)
    assert run.returncode == 0, run.stderr
    assert "SDK device 'emu' is registered" in run.stdout


@needs_cuda
def test_cuda_training_still_works_when_emu_is_validated_beside_it(tmp_path):
    """The failure the GPU trial found: the main job trained on cuda, then loaded emu and died in
    PyTorch's autograd assert. Now emu is checked in a child process and the run passes."""
    import json
    import os
    import subprocess
    import sys
    cli = os.path.join(os.path.dirname(sys.executable), "torchbridge")
    run = subprocess.run([cli, "portability", "--steps", "40", "--json", "--output", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr + run.stdout
    report = json.loads(run.stdout)
    assert report["training"]["backend"] == "cuda"
    assert {b["backend"] for b in report["validation"]["backends"]} >= {"cpu", "cuda", "emu"}
