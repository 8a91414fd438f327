"""TorchDevice compatibility: programs written for the TorchDevice package run on TorchBridge.

``import TorchDevice`` turns on TorchBridge's redirection (``torchbridge.redirect``): requests
for an accelerator this machine lacks (``.cuda()``, ``device="cuda"``, ``torch.cuda.*``) go to
the target, ``TORCHBRIDGE_BACKEND`` or else ``torchbridge.detect_best_backend()``.
``from TorchDevice import TorchDevice; device = TorchDevice(); model.to(device.device)`` gives the
device a CUDA request goes to. As in TorchDevice, constructing ``torch.device("cpu:-1")`` turns a
process-wide CPU override on (every accelerator request means the CPU; meta stays meta) and the
next one turns it off; ``TorchDevice("cpu:-1")`` is the CPU, toggling nothing.

What TorchDevice's own internals offered (``TorchDevice.core``, ``TorchDevice.ops``,
``DeviceManager``, its mocked ``torch.cuda`` functions) has no counterpart here: asking for it
raises an error that says so. The migration guide is docs/torchdevice-migration.md.
"""

import functools
import importlib.abc
import logging
import os
import sys
import warnings

import torch

import torchbridge
from torchbridge import redirect as _redirect

__version__ = torchbridge.__version__

#: What this module provides; everything else of TorchDevice raises a clear error.
__all__ = ["TorchDevice", "torch_device", "log_message", "auto_log", "__version__"]

_logger = logging.getLogger("torchbridge.redirect")
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_ORIGINAL_DEVICE = torch._C.device  # torch's own type, whatever torch.device is patched to


def _redirector():
    """The active Redirector: the one ``torchbridge run`` or the program enabled, or ours."""
    if not _redirect.is_enabled():
        _redirect.enable()  # TORCHBRIDGE_BACKEND, else the best backend; raises, saying why, when unusable
    return _redirect._active[0]


def _configure_logging_from_torchdevice_variables() -> None:
    """TorchDevice's variables, where TorchBridge's own do not say otherwise."""
    level = os.environ.get("TORCHDEVICE_LOG_LEVEL", "").strip().upper()
    if level and not os.environ.get("TORCHBRIDGE_LOG_LEVEL", "").strip():
        if level not in _LEVELS:
            raise ValueError(f"TORCHDEVICE_LOG_LEVEL={level!r} is not a logging level; expected one of "
                             f"{', '.join(_LEVELS)}")
        _logger.setLevel(level)
    if os.environ.get("TORCHDEVICE_DUMP_STACK_FRAMES", "").strip():
        warnings.warn("TORCHDEVICE_DUMP_STACK_FRAMES is not supported by TorchBridge's TorchDevice module; "
                      "TORCHBRIDGE_LOG_LEVEL=INFO logs each redirected call site (file:line) once", RuntimeWarning,
                      stacklevel=2)
    log_file = os.environ.get("TORCHDEVICE_LOG_FILE", "").strip()
    if log_file and not any(getattr(h, "baseFilename", None) == os.path.abspath(log_file) for h in _logger.handlers):
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("[torchbridge] %(message)s"))
        _logger.addHandler(handler)


def _resolve(device_type, device_index) -> torch.device:
    if device_index is not None and (isinstance(device_index, bool) or not isinstance(device_index, int)):
        raise TypeError(f"TorchDevice: device_index must be an int or None, got {device_index!r}")
    if device_type is None:  # TorchDevice's default: the accelerator, device 0
        return _redirect.resolve(f"cuda:{0 if device_index is None else device_index}")
    if isinstance(device_type, _ORIGINAL_DEVICE):
        if device_index is not None:
            raise ValueError(f"TorchDevice: device_index={device_index} given with a torch.device ({device_type}); "
                             "give the index once")
        return _redirect.resolve(device_type)
    if isinstance(device_type, int) and not isinstance(device_type, bool):
        return _redirect.resolve(device_type)  # a bare ordinal means a CUDA device, as in torch
    if not isinstance(device_type, str):
        raise TypeError(f"TorchDevice: device_type must be a str such as 'cuda' or 'cuda:1', a torch.device, an "
                        f"int or None, got {device_type!r} ({type(device_type).__name__})")
    spec = device_type.strip()
    if device_index is not None:
        if ":" in spec:
            raise ValueError(f"TorchDevice: '{spec}' already names an index; device_index={device_index} "
                             "gives it twice")
        spec = f"{spec}:{device_index}"
    # "cpu:-1" here is a request, resolved like device="cpu:-1": the CPU, toggling nothing. Only
    # constructing torch.device("cpu:-1") toggles the override (docs/torchdevice-migration.md).
    return _redirect.resolve(spec)


class _TorchDeviceType(type):
    """Class-level state TorchDevice programs read (``TorchDevice._default_device``,
    ``TorchDevice._cpu_override``), answered by the active redirection."""

    @property
    def _default_device(cls) -> str:
        return _redirect.resolve("cuda").type

    @property
    def _cpu_override(cls) -> bool:
        return _redirector().cpu_override


class TorchDevice(metaclass=_TorchDeviceType):
    """``TorchDevice()`` is the device a CUDA request goes to under redirection (device 0);
    ``TorchDevice("cuda:1")``, ``TorchDevice("mps")``, ``TorchDevice("cpu")`` or
    ``TorchDevice(torch.device(...))`` resolve that request the same way. ``.device`` is the
    ``torch.device``; other attributes (``type``, ``index``) are the device's."""

    def __init__(self, device_type=None, device_index=None):
        _redirector()
        self.device = _resolve(device_type, device_index)

    def __getattr__(self, name):
        if name == "device":  # __init__ failed before setting it
            raise AttributeError("this TorchDevice was not constructed")
        return getattr(self.device, name)

    def __repr__(self) -> str:
        return repr(self.device)

    def __str__(self) -> str:
        return str(self.device)


def log_message(message: str, torch_function: str = "unknown", stacklevel_offset: int = 0) -> None:
    """TorchDevice's logging call: the message goes to TorchBridge's redirection log at INFO."""
    del stacklevel_offset  # TorchBridge's log names no call site for free-form messages
    _logger.info("%s: %s", torch_function, message)


def auto_log():
    """TorchDevice's decorator: logs each call of the decorated function at DEBUG."""
    def decorate(function):
        @functools.wraps(function)
        def logged(*args, **kwargs):
            _logger.debug("call %s", function.__qualname__)
            return function(*args, **kwargs)

        return logged

    return decorate


_PROVIDED = ", ".join(__all__)


def __getattr__(name):
    raise AttributeError(
        f"module 'TorchDevice' has no attribute '{name}': TorchBridge's TorchDevice compatibility module provides "
        f"{_PROVIDED}; TorchDevice's internals have no counterpart (redirection is torchbridge.redirect, device "
        "descriptions torchbridge.BackendFactory; see docs/torchdevice-migration.md)")


class _NoInternals(importlib.abc.MetaPathFinder):
    """``import TorchDevice.core`` (and any other TorchDevice submodule) says what exists instead
    of a bare 'No module named'. Consulted last, so only for modules that do not exist."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("TorchDevice."):
            raise ModuleNotFoundError(
                f"No module named '{fullname}': TorchBridge's TorchDevice compatibility module has no submodules "
                f"(it provides {_PROVIDED}); TorchDevice's internals have no counterpart: see "
                "docs/torchdevice-migration.md", name=fullname)
        return None


if not any(isinstance(finder, _NoInternals) for finder in sys.meta_path):
    sys.meta_path.append(_NoInternals())

_redirector().cpu_override_toggles = True
_configure_logging_from_torchdevice_variables()

#: TorchDevice's module-level instance.
torch_device = TorchDevice()
