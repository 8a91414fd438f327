"""torch's autocast state, asked the way CUDA code asks it. A model opens autocast for "cuda" and
then asks: torch.is_autocast_enabled() (no argument means CUDA), is_autocast_enabled("cuda"),
get_autocast_dtype("cuda"), get_autocast_gpu_dtype(). Redirection opens that autocast for the
target, so the questions go to the target's state too; left to torch they answered CUDA's (off,
float16), and code that picks its compute dtype from them (attention kernels' input casts, for
one) chose float16 inside a bfloat16 autocast."""

import functools

import torch


def install(patcher, target_type):
    def target_for(device_type):
        return target_type if device_type == "cuda" else device_type

    originals = {name: getattr(torch, name) for name in (
        "is_autocast_enabled", "get_autocast_dtype", "get_autocast_gpu_dtype", "set_autocast_enabled",
        "set_autocast_dtype", "set_autocast_gpu_dtype") if hasattr(torch, name)}

    def replace(name, replacement):
        if name in originals:
            patcher.replace(torch, name, functools.wraps(originals[name])(replacement))

    def is_autocast_enabled(device_type="cuda"):
        return originals["is_autocast_enabled"](target_for(device_type))

    def get_autocast_dtype(device_type):
        return originals["get_autocast_dtype"](target_for(device_type))

    def set_autocast_enabled(device_type, enabled=None):
        if enabled is None:  # the one-argument form sets CUDA's
            device_type, enabled = "cuda", device_type
        return originals["set_autocast_enabled"](target_for(device_type), enabled)

    def set_autocast_dtype(device_type, dtype):
        return originals["set_autocast_dtype"](target_for(device_type), dtype)

    replace("is_autocast_enabled", is_autocast_enabled)
    replace("get_autocast_dtype", get_autocast_dtype)
    replace("get_autocast_gpu_dtype", lambda: get_autocast_dtype("cuda"))
    replace("set_autocast_enabled", set_autocast_enabled)
    replace("set_autocast_dtype", set_autocast_dtype)
    replace("set_autocast_gpu_dtype", lambda dtype: set_autocast_dtype("cuda", dtype))
