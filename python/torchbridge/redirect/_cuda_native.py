"""torch.cuda when the target is CUDA itself (``TORCHBRIDGE_BACKEND=cuda`` on an NVIDIA machine).

torch.cuda then stays torch's own: its functions, classes and return types are the real ones, not
the target-generic replacements of ``_cuda.build`` (those call the target's device module, which
here is the very namespace they replace: every call recursed until Python gave up, as the corpus
did on the H200 run of 2026-11-26). What redirection still adds is the device policy: a function
given a device gets it resolved first, so an index beyond this machine's GPUs wraps as a tensor's
does, and ``cpu:-1`` or ``torchbridge.redirect.cpu()`` apply."""

import functools
import inspect

import torch

from ._redirector import is_device_like

# torch.cuda functions that take a device (their parameter is named so in torch.cuda and
# torch.cuda.memory / torch.cuda.random, which _patches replaces alike).
DEVICE_TAKING = ("set_device", "get_device_name", "get_device_capability", "get_device_properties",
                 "synchronize", "memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "memory_stats", "reset_peak_memory_stats", "mem_get_info",
                 "memory_summary", "memory_stats_as_nested_dict", "reset_accumulated_memory_stats",
                 "get_rng_state", "set_rng_state", "current_stream", "default_stream")


def _resolved(device, resolve):
    """Where a device given to torch.cuda goes; a negative index keeps torch's meaning ("leave the
    current device alone") and what names no device is passed on for torch to judge."""
    if is_device_like(device) and not (isinstance(device, int) and device < 0):
        return resolve(device)
    return device


def _resolving_device(function, resolve):
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature (none in torch 2.11-2.13): left as torch's
        return function

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if "device" in bound.arguments:
            bound.arguments["device"] = _resolved(bound.arguments["device"], resolve)
        return function(*bound.args, **bound.kwargs)

    return wrapper


def replacements(redirector) -> dict:
    """{name: replacement} for torch.cuda, each wrapping torch's own function as it is now."""
    resolve = redirector.resolve
    namespace = {name: _resolving_device(getattr(torch.cuda, name), resolve)
                 for name in DEVICE_TAKING if hasattr(torch.cuda, name)}
    original_device = torch.cuda.device

    class device(original_device):
        """torch.cuda.device, for the resolved device (a negative index still means "leave the
        current device alone"); a subclass, so isinstance checks against torch's class hold."""

        def __init__(self, device):
            super().__init__(_resolved(device, resolve))

    class device_of(device):
        """torch.cuda.device_of: the device of a CUDA tensor, a no-op for any other tensor; derived
        from the class above, as torch's derives from its own, so isinstance checks agree."""

        def __init__(self, obj):
            super().__init__(obj.get_device() if obj.is_cuda else -1)

    namespace["device"] = device
    namespace["device_of"] = device_of
    return namespace
