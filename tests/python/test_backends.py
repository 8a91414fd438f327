"""The Python backend API against the C++ CLI's JSON and the operating system. No SDK device is
loaded in this process."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

import torchbridge
from torchbridge.backends import Backend, BackendFactory, DeviceInfo, detect_best_backend
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
    assert isinstance(info, DeviceInfo)
    assert info.cpu.logical_cores == os.cpu_count()
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    total = int(meminfo["MemTotal"].split()[0]) * 1024
    assert info.total_memory_bytes == total
    assert isinstance(info.memory_total_gb, float) and info.memory_total_gb == pytest.approx(total / 1024**3)
    assert "float32" in info.supported_dtypes and torch.float32 in info.torch_dtypes
    assert ("bfloat16" in info.supported_dtypes) == backend.supports_bf16()
    assert backend.supports_fp8() is False
    cli_device = cli_json("info", "--backend", "cpu")["backends"][0]["devices"][0]["info"]
    assert info.name == cli_device["name"]
    assert info.to_dict()["cpu"] == cli_device["cpu"]
    assert info.supported_dtypes == tuple(cli_device["supported_dtypes"])
    assert info.compute_capability == cli_device["architecture"]  # not NVIDIA: the architecture name


def test_device_info_is_a_frozen_dataclass_with_the_documented_fields_first():
    info = BackendFactory.create("cpu").get_device_info()
    names = [f.name for f in dataclasses.fields(info)]
    assert names[:6] == ["name", "backend", "memory_total_gb", "memory_available_gb", "compute_capability",
                         "supported_dtypes"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.name = "other"
    # The documented example, verbatim.
    text = f"Device: {info.name}\nMemory: {info.memory_total_gb:.1f} GB\nSupported dtypes: {info.supported_dtypes}"
    assert info.name in text and "float32" in text
    # Readable print: one line per fact, the name and the memory in GB in it.
    printed = str(info)
    assert printed.splitlines()[0].startswith(info.name) and f"{info.memory_total_gb:.2f} GB" in printed
    # JSON for machines: round-trips, nested dataclasses become dicts, no private fields.
    data = json.loads(info.to_json())
    assert data == info.to_dict() and data["name"] == info.name and data["total_memory_bytes"] == info.total_memory_bytes
    assert isinstance(data["features"], dict) and not any(k.startswith("_") for k in data)


def test_device_info_dict_access_still_works_with_a_deprecation_warning():
    info = BackendFactory.create("cpu").get_device_info()
    with pytest.warns(DeprecationWarning, match=r"info\['name'\] is deprecated"):
        assert info["name"] == info.name
    with pytest.warns(DeprecationWarning):
        assert info["total_memory_bytes"] == info.total_memory_bytes
    with pytest.warns(DeprecationWarning):
        assert torch.float32 in info["supported_dtypes"]  # the old dict held torch dtypes
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError, match="'nmae'"):
        info["nmae"]


def test_cuda_capability_from_the_architecture():
    from torchbridge.backends.device_info import compute_capability, cuda_capability

    assert compute_capability("sm_90") == "9.0" and compute_capability("sm_120") == "12.0"
    assert cuda_capability("sm_86") == (8, 6) and cuda_capability("gfx942") is None
    assert compute_capability("gfx942") == "gfx942" and compute_capability(None) is None


def test_memory_stats_have_the_documented_mb_keys():
    backend = BackendFactory.create("cpu")
    stats = backend.get_memory_stats()
    for key in ("allocated", "free", "reserved", "total", "peak_allocated"):
        assert key in stats, key
        byte_value = stats[f"{key}_bytes"]
        assert (stats[key] is None) == (byte_value is None)
        if byte_value is not None:
            assert stats[key] == pytest.approx(byte_value / 2**20)
    assert stats["reserved"] is None  # unknown on the CPU stays unknown in MB too, never 0
    assert stats["total"] == pytest.approx(backend.get_device_info().total_memory_bytes / 2**20)


def test_vendor_classes_take_device_index_and_optimization_level():
    backend = CPUBackend(optimization_level="o0", device_index=0)
    assert backend.optimization_level == "O0" and backend.device_index == 0
    model = backend.prepare_model(torch.nn.Linear(3, 2))
    assert model.weight.device == backend.device
    # The level given at construction is the one prepare_model applies ...
    later = CPUBackend(optimization_level="O1")
    assert later.optimization_level == "O1"
    assert later.prepare_model(torch.nn.Conv2d(3, 2, 3)).weight.is_contiguous(memory_format=torch.channels_last)
    # ... and a per-call level overrides it, both ways.
    assert later.prepare_model(torch.nn.Conv2d(3, 2, 3), optimization_level="O0").weight.is_contiguous()
    assert backend.prepare_model(torch.nn.Conv2d(3, 2, 3), optimization_level="O1").weight.is_contiguous(
        memory_format=torch.channels_last)
    assert BackendFactory.create("cpu", optimization_level="O3").optimization_level == "O3"


def test_vendor_class_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="'O7'"):
        CPUBackend(optimization_level="O7")
    with pytest.raises(TypeError, match="optimization_level must be a str.*got 2"):
        CPUBackend(optimization_level=2)
    with pytest.raises(TypeError, match="device_index must be an int.*'0'"):
        CPUBackend(device_index="0")
    with pytest.raises(TypeError, match="device_index must be an int.*True"):
        CPUBackend(device_index=True)
    with pytest.raises(IndexError, match="device index 5"):
        CPUBackend(device_index=5)
    with pytest.raises(TypeError, match="nn.Module"):
        CPUBackend().prepare_model("model")


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
    eval_model = torch.nn.Linear(3, 2).eval()  # inference at O2: weights in the precision "auto" decides
    expected = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(backend.precision_policy().precision, torch.float32)
    assert backend.prepare_model(eval_model, optimization_level="O2").weight.dtype == expected
    with pytest.raises(ValueError, match="'O9'"):
        backend.prepare_model(torch.nn.Linear(3, 2), optimization_level="O9")


def test_bad_device_index():
    with pytest.raises(IndexError, match="device index 3"):
        Backend("cpu", device_index=3)


def test_console_script_runs_the_same_cpp_code_as_the_binary():
    # The binary of the build under test (CTest passes it): a build elsewhere (scripts/gpu-check.sh
    # builds in its own directory) against another torch reported that torch's version.
    binary = os.environ.get("TORCHBRIDGE_CLI_PATH")
    if binary is None:
        pytest.skip("the C++ binary's path comes from CTest (TORCHBRIDGE_CLI_PATH)")
    ours = subprocess.run([CONSOLE_SCRIPT, "info", "--backend", "cpu", "--json"], capture_output=True,
                          text=True, check=True)
    theirs = subprocess.run([binary, "info", "--backend", "cpu", "--json"], capture_output=True, text=True, check=True)
    strip = lambda doc: {k: v for k, v in json.loads(doc).items() if k != "backends"}  # noqa: E731
    assert strip(ours.stdout) == strip(theirs.stdout)
    bad = subprocess.run([CONSOLE_SCRIPT, "info", "--backend", "nope"], capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown backend 'nope'" in bad.stderr


def _fake_torch_xla(root, device_type_body):
    """A torch_xla package whose runtime.device_type() runs ``device_type_body``; stands in for
    the real one (not installable here) to show what detection does on a host that has it."""
    package = root / "torch_xla"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "runtime.py").write_text(f"def device_type():\n    {device_type_body}\n")
    return root


@pytest.mark.parametrize("body, environment, expected", [
    ("return 'TPU'", {}, "tpu"),                                # before: "cpu", the C++ core cannot see TPUs
    ("return 'TPU'", {"TORCHBRIDGE_BACKEND": "cpu"}, "cpu"),     # a named backend wins
    ("return 'TPU'", {"TORCHBRIDGE_BACKEND": "auto"}, "tpu"),    # "auto" means detect
    ("return 'CPU'", {}, "cpu"),                                # XLA on the CPU is not a TPU
])
def test_detection_finds_tpus_through_torch_xla(tmp_path, body, environment, expected):
    env = {key: value for key, value in os.environ.items() if key != "TORCHBRIDGE_BACKEND"}
    env.update(environment, PYTHONPATH=str(_fake_torch_xla(tmp_path, body)))
    run = subprocess.run([sys.executable, "-c", "import torchbridge; print(torchbridge.detect_best_backend())"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == expected, run.stderr[-2000:]


def test_a_broken_torch_xla_is_reported_and_detection_goes_on_without_tpus(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TORCHBRIDGE_BACKEND"}
    env["PYTHONPATH"] = str(_fake_torch_xla(tmp_path, "raise OSError('libtpu.so: cannot open shared object file')"))
    run = subprocess.run([sys.executable, "-c", "import torchbridge; print(torchbridge.detect_best_backend())"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "cpu", run.stderr[-2000:]
    assert "torch_xla is installed but could not say whether this machine has TPUs (OSError: libtpu.so" in run.stderr


def test_the_tpu_backend_has_the_backend_api_or_says_why_not(tmp_path):
    """get_device_info(0), get_memory_stats(0) and synchronize(0) raised TypeError (no index
    parameter); precision_policy, supports_*, empty_cache and reset_peak_memory_stats were missing
    (AttributeError); decide() and UnifiedManager said "backend 'tpu' is not available" on a host
    where TPUs had just been detected (found 2026-11-29)."""
    root = _fake_torch_xla(tmp_path, "return 'TPU'")
    (root / "torch_xla" / "core").mkdir()
    (root / "torch_xla" / "core" / "__init__.py").write_text("")
    (root / "torch_xla" / "core" / "xla_model.py").write_text(
        "def get_xla_supported_devices():\n    return ['xla:0', 'xla:1']\n"
        "def get_memory_info(device):\n    return {'bytes_used': 1024 * (1 + device.index), 'bytes_limit': 2**34}\n"
        "def wait_device_ops():\n    pass\n")
    program = """
import torchbridge
from torchbridge.backends import BackendFactory
tpu = BackendFactory.create()
print(tpu.get_device_info(1).name, tpu.get_memory_stats(1)["allocated_bytes"],
      tpu.get_memory_stats()["allocated_bytes"])
tpu.synchronize(1)
for call in (lambda: tpu.get_memory_stats(2), lambda: tpu.supports_bf16(), lambda: tpu.empty_cache(),
             lambda: torchbridge.precision.decide("auto"),
             lambda: torchbridge.UnifiedManager(torchbridge.TorchBridgeConfig(optimization_level="O0"))):
    try:
        call()
    except (IndexError, NotImplementedError) as error:
        print(type(error).__name__, error)
"""
    env = {key: value for key, value in os.environ.items() if key != "TORCHBRIDGE_BACKEND"}
    env["PYTHONPATH"] = str(root)
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "xla:1 2048 1024"
    assert lines[1].startswith("IndexError device index 2 is out of range for backend 'tpu', which has 2 devices")
    assert lines[2].startswith("NotImplementedError TPUBackend.supports_bf16 is not available for TPUs: the precision "
                               "table is the C++ core's, which cannot describe TPUs")
    assert lines[3].startswith("NotImplementedError TPUBackend.empty_cache is not available for TPUs")
    assert lines[4].startswith("NotImplementedError TPUBackend.precision_policy is not available for TPUs")
    assert lines[5].startswith("NotImplementedError UnifiedManager is not available for TPUs")


def test_a_tpu_host_names_tpu_in_saved_training_states_and_refuses_an_auto_device_map(tmp_path):
    # Both used the C++ detection, which cannot see TPUs: the state said "cpu" and the auto map
    # placed every module on the CPU, silently.
    env = {key: value for key, value in os.environ.items() if key != "TORCHBRIDGE_BACKEND"}
    env["PYTHONPATH"] = str(_fake_torch_xla(tmp_path, "return 'TPU'"))
    program = f"""
import torch
from safetensors import safe_open
from torchbridge import checkpoint
model = torch.nn.Sequential(torch.nn.Linear(4, 4))
path = checkpoint.save_state({str(tmp_path / "state.safetensors")!r}, model)
with safe_open(path, framework="pt") as file:
    print(file.metadata()["torchbridge.source_backend"])
try:
    checkpoint.load_state(path, model, device_map="auto")
except ValueError as error:
    print(error)
"""
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    backend, error = run.stdout.strip().splitlines()
    assert backend == "tpu"
    assert error == ("device_map 'auto': the auto map spreads modules by free memory, which TorchBridge cannot "
                     "read on TPUs; pass a dict such as {'': 'xla:0'}, or 'auto:cpu'")
