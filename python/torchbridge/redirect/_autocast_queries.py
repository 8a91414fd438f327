"""torch's autocast state, asked the way CUDA code asks it. A model opens autocast for "cuda" and
then asks: torch.is_autocast_enabled() (no argument means CUDA), is_autocast_enabled("cuda"),
get_autocast_dtype("cuda"), get_autocast_gpu_dtype(). Redirection opens that autocast for the
target, so the questions go to the target's state too; left to torch they answered CUDA's (off,
float16), and code that picks its compute dtype from them (attention kernels' input casts, for
one) chose float16 inside a bfloat16 autocast.

CUDA's autocast dtype starts as float16, an SDK device's too, the CPU's as bfloat16. With the CPU
as the target, CUDA's dtype is therefore kept apart (CudaAutocastDtype) outside autocast regions:
torch.autocast("cuda") computes in float16 there as on a GPU, and as torch.cuda.amp.autocast()
does, while the program's own torch.autocast("cpu") keeps the CPU's bfloat16."""

import functools
import threading

import torch


class CudaAutocastDtype(threading.local):
    """CUDA's autocast dtype when the CPU is the target, per thread as torch keeps it. Inside an
    autocast region (the CPU's autocast runs CUDA's) it is the CPU's; outside, it is `dtype`, what
    torch.autocast("cuda") then starts with."""

    def __init__(self):
        self.dtype = torch.float16  # CUDA's default
        self.cpu_dtype = None  # the CPU's own, put aside while set_autocast_enabled("cuda", True) holds


def _in_an_autocast_region() -> bool:
    """Whether an autocast region (torch.autocast's, any device type, enabled or not) is open on this
    thread. torch counts them but has no getter: one more and one fewer answers, changing nothing."""
    torch.autocast_increment_nesting()
    return torch.autocast_decrement_nesting() > 0


def install(patcher, target_type) -> bool:
    """Replaces torch's autocast queries; True where CUDA's autocast dtype is kept apart from the
    target's (the CPU target), which the redirected torch.autocast("cuda") then starts with."""

    def target_for(device_type):
        return target_type if device_type == "cuda" else device_type

    originals = {name: getattr(torch, name) for name in (
        "is_autocast_enabled", "get_autocast_dtype", "get_autocast_gpu_dtype", "set_autocast_enabled",
        "set_autocast_dtype", "set_autocast_gpu_dtype") if hasattr(torch, name)}
    cuda = CudaAutocastDtype() if target_type == "cpu" else None

    def replace(name, replacement):
        if name in originals:
            patcher.replace(torch, name, functools.wraps(originals[name])(replacement))

    def cuda_runs_on_the_cpu():
        """Whether CUDA's autocast state is the CPU's now: inside a region, or while it is on."""
        return originals["is_autocast_enabled"]("cpu") or _in_an_autocast_region()

    def is_autocast_enabled(device_type="cuda"):
        return originals["is_autocast_enabled"](target_for(device_type))

    def get_autocast_dtype(device_type):
        if device_type == "cuda" and cuda is not None and not cuda_runs_on_the_cpu():
            return cuda.dtype
        return originals["get_autocast_dtype"](target_for(device_type))

    def set_autocast_enabled(device_type, enabled=None):
        if enabled is None:  # the one-argument form sets CUDA's
            device_type, enabled = "cuda", device_type
        if device_type == "cuda" and cuda is not None:
            # Turned on by hand outside a region, CUDA's autocast computes in CUDA's dtype; turned
            # off there it gives the CPU its own back, as leaving torch.autocast("cuda") does.
            if enabled and not cuda_runs_on_the_cpu():
                cuda.cpu_dtype = originals["get_autocast_dtype"]("cpu")
                originals["set_autocast_dtype"]("cpu", cuda.dtype)
            elif not enabled and cuda.cpu_dtype is not None and not _in_an_autocast_region():
                cuda.dtype = originals["get_autocast_dtype"]("cpu")
                originals["set_autocast_dtype"]("cpu", cuda.cpu_dtype)
                cuda.cpu_dtype = None
        return originals["set_autocast_enabled"](target_for(device_type), enabled)

    def set_autocast_dtype(device_type, dtype):
        if device_type == "cuda" and cuda is not None and not cuda_runs_on_the_cpu():
            if not isinstance(dtype, torch.dtype):  # as torch refuses it
                raise TypeError(f"set_autocast_dtype(): argument 'dtype' (position 2) must be torch.dtype, "
                                f"not {type(dtype).__name__}")
            cuda.dtype = dtype
            return None
        return originals["set_autocast_dtype"](target_for(device_type), dtype)

    replace("is_autocast_enabled", is_autocast_enabled)
    replace("get_autocast_dtype", get_autocast_dtype)
    replace("get_autocast_gpu_dtype", lambda: get_autocast_dtype("cuda"))
    replace("set_autocast_enabled", set_autocast_enabled)
    replace("set_autocast_dtype", set_autocast_dtype)
    replace("set_autocast_gpu_dtype", lambda dtype: set_autocast_dtype("cuda", dtype))
    return cuda is not None
