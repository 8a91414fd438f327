"""The Python backend API against the C++ CLI's JSON and the operating system. No SDK device is
loaded in this process."""

import json
import os
import subprocess
import sys

import pytest
import torch

import torchbridge
from torchbridge.backends import Backend, BackendFactory, detect_best_backend
from torchbridge.backends.amd import AMDBackend
from torchbridge.backends.cpu import CPUBackend
from torchbridge.backends.intel import IntelBackend
from torchbridge.backends.mps import MPSBackend
from torchbridge.backends.nvidia import NVIDIABackend
from torchbridge.backends.tpu import TPUBackend


# The console script pip installed next to this interpreter.
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def cli_json(*args):
    out = subprocess.run([CONSOLE_SCRIPT, *args, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_importing_registers_no_device():
    assert torchbridge.devices.loaded() is None
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"


def test_version_is_the_libraries_version():
    version = open(os.path.join(os.path.dirname(__file__), "..", "..", "VERSION")).read().strip()
    assert torchbridge.__version__ == version
    out = subprocess.run([CONSOLE_SCRIPT, "--version"], capture_output=True, text=True, check=True)
    assert version in out.stdout


def test_detect_best_backend_matches_the_cli():
    assert detect_best_backend() == cli_json("info")["best_backend"]


def test_cpu_backend_describes_the_machine():
    backend = BackendFactory.create("cpu")
    assert isinstance(backend, CPUBackend)
    assert backend.device == torch.device("cpu")
    info = backend.get_device_info()
    assert info["cpu"]["logical_cores"] == os.cpu_count()
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    total = int(meminfo["MemTotal"].split()[0]) * 1024
    assert info["total_memory_bytes"] == total
    assert info["memory_total_gb"] == pytest.approx(total / 1024**3)
    assert torch.float32 in info["supported_dtypes"]
    assert (torch.bfloat16 in info["supported_dtypes"]) == backend.supports_bf16()
    assert backend.supports_fp8() is False
    cli_device = cli_json("info", "--backend", "cpu")["backends"][0]["devices"][0]["info"]
    assert info["name"] == cli_device["name"]
    assert info["cpu"] == cli_device["cpu"]


def test_cpu_memory_stats_move_with_allocations():
    backend = BackendFactory.create("cpu")
    before = backend.get_memory_stats()
    assert before["source"].startswith("os:")
    assert before["reserved_bytes"] is None  # the CPU allocator does not track it: None, not 0
    big = torch.ones(64 * 1024 * 1024, dtype=torch.uint8)
    after = backend.get_memory_stats()
    assert after["allocated_bytes"] - before["allocated_bytes"] >= 48 * 1024 * 1024
    del big


def test_aliases_and_vendor_classes():
    assert BackendFactory.create("CPU").name == "cpu"
    assert {"nvidia", "hip", "amd", "intel", "apple", "xla", "cpu"} <= set(BackendFactory.names())
    assert "cpu" in BackendFactory.available_backends()
    assert Backend("cpu").name == "cpu"


def test_unknown_name_is_a_value_error_listing_valid_names():
    with pytest.raises(ValueError, match=r"unknown backend 'warp'.*valid names: .*cpu.*cuda"):
        BackendFactory.create("warp")


@pytest.mark.parametrize("cls,name", [(NVIDIABackend, "cuda"), (AMDBackend, "rocm"), (IntelBackend, "xpu"),
                                      (MPSBackend, "mps")])
def test_unavailable_vendor_backends_raise_with_the_reason(cls, name):
    status, reason = torchbridge._C.lookup(name).availability()
    if status == "available":
        pytest.skip(f"{name} is available here")
    with pytest.raises(RuntimeError, match="not available"):
        cls()
    with pytest.raises(RuntimeError, match=reason.split("(")[0].strip()):
        BackendFactory.create(name)


def test_tpu_backend_names_the_missing_package():
    try:
        import torch_xla  # noqa: F401
        pytest.skip("torch_xla is installed")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match="torch_xla"):
        TPUBackend()
    with pytest.raises(RuntimeError, match="torch_xla"):
        BackendFactory.create("xla")


def test_environment_override(monkeypatch):
    monkeypatch.setenv("TORCHBRIDGE_BACKEND", "cpu")
    assert detect_best_backend() == "cpu"
    assert BackendFactory.create().name == "cpu"
    monkeypatch.setenv("TORCHBRIDGE_BACKEND", "bogus")
    with pytest.raises(ValueError, match="TORCHBRIDGE_BACKEND='bogus'"):
        detect_best_backend()


def test_prepare_model():
    backend = BackendFactory.create("cpu")
    model = backend.prepare_model(torch.nn.Linear(3, 2), optimization_level="O0")
    assert model.weight.device == backend.device
    with pytest.raises(NotImplementedError, match="O2 is not yet supported"):
        backend.prepare_model(torch.nn.Linear(3, 2), optimization_level="O2")
    with pytest.raises(ValueError, match="'O9'"):
        backend.prepare_model(torch.nn.Linear(3, 2), optimization_level="O9")


def test_bad_device_index():
    with pytest.raises(IndexError, match="device index 3"):
        Backend("cpu", device_index=3)


def test_console_script_runs_the_same_cpp_code_as_the_binary():
    binary = os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "torchbridge")
    if not os.path.exists(binary):
        pytest.skip("build/bin/torchbridge not built")
    ours = subprocess.run([CONSOLE_SCRIPT, "info", "--backend", "cpu", "--json"], capture_output=True,
                          text=True, check=True)
    theirs = subprocess.run([binary, "info", "--backend", "cpu", "--json"], capture_output=True, text=True, check=True)
    strip = lambda doc: {k: v for k, v in json.loads(doc).items() if k != "backends"}  # noqa: E731
    assert strip(ours.stdout) == strip(theirs.stdout)
    bad = subprocess.run([CONSOLE_SCRIPT, "info", "--backend", "nope"], capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown backend 'nope'" in bad.stderr
