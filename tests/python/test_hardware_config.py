"""The configuration's vendor sections from Python (torchbridge.core.config and
TorchBridgeConfig.hardware): the documented classes and fields, typo and type errors, files and
the environment, what UnifiedManager does with each on this CPU (applied, reported, refused, never
dropped), and `torchbridge info --config`. The per-vendor rules on fixed GPU descriptions are
tested in C++ (tests/cpp/hardware_config_test.cpp)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from torchbridge import TorchBridgeConfig, UnifiedManager
from torchbridge._hardware_steps import hardware_step
from torchbridge.backends import BackendFactory
from torchbridge.core.config import AMDArchitecture, AMDConfig, IntelConfig, NVIDIAConfig, TPUConfig

CPU = BackendFactory.create("cpu").get_device_info()
INTEL_CPU = CPU.to_dict()["vendor"] in ("GenuineIntel", "Intel")
HAS_AMX = CPU.to_dict()["cpu"]["isa"]["amx_bf16"]
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def outcome(manager, name):
    [step] = [s for s in manager.report().steps if s.name == name]
    return step.outcome, step.detail


def cpu_config(**hardware):
    config = TorchBridgeConfig(backend="cpu", compile=False)
    for section, values in hardware.items():
        for field, value in values.items():
            setattr(getattr(config.hardware, section), field, value)
    return config


def test_the_documented_classes_and_defaults():
    amd = AMDConfig(architecture=AMDArchitecture.CDNA3, enable_matrix_cores=True, memory_pool_size_gb=8.0)
    assert amd.architecture is AMDArchitecture.CDNA3 and amd.memory_pool_size_gb == 8.0
    assert IntelConfig(enable_ipex=True, enable_onednn=True, enable_amx=True).enable_ipex
    assert TPUConfig(precision="bfloat16", enable_xla_cache=True, cache_max_size=100).enable_xla_cache
    config = TorchBridgeConfig.for_training()
    assert config.hardware.nvidia == NVIDIAConfig() and config.hardware.amd.architecture == "auto"
    # The Python defaults are the C++ schema's.
    assert json.loads(config.to_json())["hardware"] == json.loads(TorchBridgeConfig().validate().to_json())["hardware"]


def test_a_typo_names_the_closest_field_and_a_wrong_type_the_expected_one():
    config = TorchBridgeConfig.for_training()
    with pytest.raises(AttributeError, match="NVIDIAConfig has no field 'fp8_enable'; did you mean 'fp8_enabled'"):
        config.hardware.nvidia.fp8_enable = True
    with pytest.raises(AttributeError, match="did you mean 'precision'"):
        config.precison = "bf16"
    with pytest.raises(TypeError, match="AMDConfig has no field 'enable_matrix_core'; did you mean 'enable_matrix_cores'"):
        AMDConfig(enable_matrix_core=False)
    with pytest.raises(TypeError, match=r"AMDConfig.memory_pool_size_gb: expected float, got str '8'"):
        config.hardware.amd.memory_pool_size_gb = "8"
    with pytest.raises(TypeError, match="NVIDIAConfig.fp8_enabled: expected bool, got int 1"):
        config.hardware.nvidia.fp8_enabled = 1
    with pytest.raises(ValueError, match="AMDConfig.architecture: expected one of auto, CDNA1"):
        config.hardware.amd.architecture = "CDNA9"
    config.hardware.nvidia.flash_attention_version = "4"  # a string: the domain is checked in C++
    with pytest.raises(ValueError, match="flash_attention_version: expected one of auto, 2, 3, got '4'"):
        config.validate()


def test_files_dicts_and_the_environment_fill_the_sections(tmp_path, monkeypatch):
    path = tmp_path / "run.toml"
    path.write_text('precision = "fp32"\n[hardware.amd]\narchitecture = "CDNA3"\nmemory_pool_size_gb = 8\n')
    config = TorchBridgeConfig.from_file(path)
    assert config.hardware.amd.architecture is AMDArchitecture.CDNA3 and config.hardware.amd.memory_pool_size_gb == 8.0
    (tmp_path / "typo.json").write_text('{"hardware": {"nvidia": {"fp8_enable": true}}}')
    with pytest.raises(ValueError, match="unknown key 'hardware.nvidia.fp8_enable'; did you mean 'hardware.nvidia.fp8_enabled'"):
        TorchBridgeConfig.from_file(tmp_path / "typo.json")
    config = TorchBridgeConfig.from_dict({"hardware": {"intel": {"enable_onednn": False}}}, base=config)
    assert not config.hardware.intel.enable_onednn and config.hardware.amd.architecture == "CDNA3"
    monkeypatch.setenv("TORCHBRIDGE_HARDWARE_NVIDIA_FP8_ENABLED", "yes")
    assert config.with_environment().hardware.nvidia.fp8_enabled


def test_another_vendors_settings_are_reported_by_the_manager():
    manager = UnifiedManager(cpu_config(nvidia={"fp8_enabled": True, "enable_oom_protection": True},
                                        amd={"memory_pool_size_gb": 4.0}, tpu={"enable_xla_cache": True}))
    manager.optimize(torch.nn.Linear(16, 16))
    for name, vendor in [("hardware.nvidia.fp8_enabled", "NVIDIA GPUs"), ("hardware.nvidia.enable_oom_protection",
                         "NVIDIA GPUs"), ("hardware.amd.memory_pool_size_gb", "AMD GPUs"),
                         ("hardware.tpu.enable_xla_cache", "TPUs")]:
        result, detail = outcome(manager, name)
        assert result == "skipped" and detail.endswith(f"it is for {vendor}"), (name, detail)
    assert "fp8_enabled" in manager.report().to_json()


def test_onednn_off_is_applied_to_torch(fresh_python):
    fresh_python("""
import torch
from torchbridge import TorchBridgeConfig, UnifiedManager
config = TorchBridgeConfig(backend="cpu", compile=False)
config.hardware.intel.enable_onednn = False
manager = UnifiedManager(config)
manager.optimize(torch.nn.Linear(4, 4))
assert torch.backends.mkldnn.enabled is False
assert [s.outcome for s in manager.report().steps if s.name == "hardware.intel.enable_onednn"] == ["applied"]
""")


def test_ipex_and_amx_on_this_cpu():
    config = cpu_config(intel={"enable_ipex": True, "enable_amx": False})
    if HAS_AMX:
        with pytest.raises(ValueError, match="ONEDNN_MAX_CPU_ISA"):
            UnifiedManager(config)
        return
    manager = UnifiedManager(config)
    manager.optimize(torch.nn.Linear(4, 4))
    result, detail = outcome(manager, "hardware.intel.enable_ipex")
    assert result == "skipped"
    assert detail == ("intel_extension_for_pytorch is not installed, so nothing was done" if INTEL_CPU
                      else f"has no effect on cpu:0 ({CPU.name}): it is for Intel CPUs and GPUs")
    assert outcome(manager, "hardware.intel.enable_amx") == ("skipped", f"cpu:0 ({CPU.name}) has no AMX, so nothing uses it anyway")


def test_oom_protection_retries_a_forward_once():
    calls = []

    class Flaky(torch.nn.Module):
        def forward(self, x):
            calls.append(1)
            if len(calls) == 1:
                raise torch.OutOfMemoryError("out of memory (simulated)")
            return x * 2

    model, _, refused, _ = hardware_step("hardware.nvidia.enable_oom_protection", "", Flaky(), None,
                                         torch.device("cpu"))
    assert refused is None
    assert torch.equal(model(torch.ones(2)), torch.full((2,), 2.0)) and len(calls) == 2


def test_info_shows_what_a_configuration_file_does_on_each_device(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"hardware": {"nvidia": {"fp8_enabled": true}}}')
    run = subprocess.run([CONSOLE_SCRIPT, "info", "--backend", "cpu", "--json", "--config", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    [device] = json.loads(run.stdout)["backends"][0]["devices"]
    assert device["hardware_settings"] == [{"field": "hardware.nvidia.fp8_enabled", "applies": False,
                                            "detail": f"has no effect on cpu:0 ({CPU.name}): it is for NVIDIA GPUs"}]
