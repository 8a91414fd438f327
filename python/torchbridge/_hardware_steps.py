"""The Python executor's half of the configuration's vendor sections (hardware.*): what an
applying hardware step does to the model or the process. The C++ plan decides which steps apply
and why (src/optimize/hardware_config.cpp); this carries them out or says why it could not.

Every function returns (model, optimizer, refusal or None, what it did or None), as
UnifiedManager._execute does."""

import functools
import gc
import importlib.util

import torch

from ._forward_wrapping import wrap_forward


def hardware_step(name: str, argument: str, model, optimizer, device: torch.device):
    if name in ("hardware.nvidia.fp8_enabled", "hardware.amd.architecture", "hardware.amd.enable_matrix_cores"):
        # Their effect is elsewhere: the fp8 step, the constructor's check, the precision decision.
        return model, optimizer, None, None
    if name == "hardware.nvidia.flash_attention_version":
        return (model, optimizer, *_flash_attention(argument))
    if name == "hardware.nvidia.enable_oom_protection":
        wrap_forward(model, _retry_after_oom, device)
        return model, optimizer, None, None
    if name == "hardware.amd.memory_pool_size_gb":
        return (model, optimizer, *_cap_memory(float(argument), device)) if argument else (
            model, optimizer, "the plan gave no size", None)
    if name == "hardware.intel.enable_ipex":
        return _ipex(model, optimizer)
    if name == "hardware.intel.enable_onednn":
        torch.backends.mkldnn.enabled = False
        return model, optimizer, None, None
    raise RuntimeError(f"the optimization plan has a step {name!r} the Python executor does not know")


def _flash_attention(version: str):
    attention = torch.nn.attention
    if version == "2":
        torch.backends.cuda.enable_flash_sdp(True)
        if getattr(attention, "current_flash_attention_impl", lambda: None)() not in (None, "FA2"):
            attention.restore_flash_attention_impl()
        return None, None
    available = list(getattr(attention, "list_flash_attention_impls", lambda: [])())
    if "FA3" not in available:
        return (f"this torch has no FlashAttention-3 implementation registered "
                f"(torch.nn.attention.list_flash_attention_impls() = {available})"), None
    attention.activate_flash_attention_impl("FA3")
    return None, None


def _retry_after_oom(forward, device: torch.device):
    @functools.wraps(forward)
    def protected(module, *args, **kwargs):
        try:
            return forward(module, *args, **kwargs)
        except torch.OutOfMemoryError:
            gc.collect()
            torch.cuda.empty_cache()
        try:
            return forward(module, *args, **kwargs)
        except torch.OutOfMemoryError as error:
            allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
            total = torch.cuda.get_device_properties(device).total_memory
            raise torch.OutOfMemoryError(
                f"{error}\n(torchbridge enable_oom_protection: still out of memory after freeing cached blocks "
                f"and retrying once; {allocated} B allocated, {reserved} B reserved of {total} B on {device})"
            ) from error

    return protected


def _cap_memory(gigabytes: float, device: torch.device):
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gigabytes * 1e9 / total), device)
    return None, f"the caching allocator is capped at {gigabytes:g} GB of {total / 1e9:.1f} GB"


def _ipex(model, optimizer):
    if importlib.util.find_spec("intel_extension_for_pytorch") is None:
        return model, optimizer, "intel_extension_for_pytorch is not installed, so nothing was done", None
    import intel_extension_for_pytorch as ipex

    if optimizer is None:
        return ipex.optimize(model), optimizer, None, None
    model, optimizer = ipex.optimize(model, optimizer=optimizer)
    return model, optimizer, None, None
