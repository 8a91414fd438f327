"""The device-resolution state of an active redirection: policy (in C++), call-site logging,
the scoped CPU override."""

import collections
import logging
import os
import sys
import threading

import torch

from .. import _C

logger = logging.getLogger("torchbridge.redirect")
_ORIGINAL_DEVICE = torch.device
_THIS_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_PACKAGE = os.path.dirname(os.path.abspath(torch.__file__))


def is_device_like(value) -> bool:
    """A value that names a device as torch accepts one: a string, an index or a torch.device."""
    return isinstance(value, (str, int, torch._C.device)) and not isinstance(value, bool)


def configure_logging():
    """Quiet by default; TORCHBRIDGE_LOG_LEVEL=INFO shows each redirected call site once."""
    level = os.environ.get("TORCHBRIDGE_LOG_LEVEL", "WARNING").upper()
    if level not in logging._nameToLevel:
        raise ValueError(f"TORCHBRIDGE_LOG_LEVEL={level!r} is not a logging level; expected one of "
                         "DEBUG, INFO, WARNING, ERROR, CRITICAL")
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[torchbridge] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def _call_site():
    """file:line of the first caller outside torchbridge and torch."""
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith((_THIS_PACKAGE, _TORCH_PACKAGE)) and not path.startswith("<frozen"):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


class Redirector:
    def __init__(self, target: str, explicit: bool = True):
        """``explicit``: the user named the target (argument or TORCHBRIDGE_BACKEND), so it takes
        every accelerator request; a detected target takes only requests for missing devices."""
        self.target = target
        self.explicit = explicit
        self._cache = {}
        self._cpu_cache = {}  # the same under a CPU override
        self._logged_sites = set()
        self._warned_indices = set()
        self.redirected_calls = collections.Counter()  # "requested -> used" -> count
        self._local = threading.local()
        # TorchDevice semantics (the TorchDevice compatibility module turns them on): constructing
        # torch.device("cpu:-1") switches a process-wide CPU override on, and the next one off.
        # Either override sends accelerator requests to the CPU; cpu, meta and lazy stay.
        self.cpu_override_toggles = False
        self.cpu_override = False

    # -- the CPU overrides: scoped (torchbridge.redirect.cpu()) and TorchDevice's process-wide one --
    @property
    def forced_cpu(self) -> bool:
        return self.cpu_override or getattr(self._local, "cpu_depth", 0) > 0

    def cpu_device_requested(self):
        """torch.device("cpu:-1") was constructed: that device is the CPU; with TorchDevice
        semantics it also toggles the process-wide override."""
        if self.cpu_override_toggles:
            self.cpu_override = not self.cpu_override
            logger.info("%s: 'cpu:-1' turns the CPU override %s: every accelerator request %s", _call_site(),
                        "on" if self.cpu_override else "off",
                        "means the CPU" if self.cpu_override else f"is redirected to '{self.target}' again")

    def push_cpu(self):
        self._local.cpu_depth = getattr(self._local, "cpu_depth", 0) + 1

    def pop_cpu(self):
        self._local.cpu_depth -= 1

    # -- resolution ---------------------------------------------------------------------------------
    def resolve(self, device):
        """The torch.device to use for a requested device (str, int, torch.device or None)."""
        if device is None:
            return None
        if isinstance(device, int):
            requested = f"cuda:{device}"  # torch reads a bare index as a CUDA ordinal
        elif isinstance(device, _ORIGINAL_DEVICE):
            requested = str(device)
        elif isinstance(device, str):
            requested = device.strip()
        else:
            return device
        if self.forced_cpu:
            return self._on_the_cpu(requested)
        cached = self._cache.get(requested)
        if cached is None:
            device_type, index, redirected, wrapped = _C.resolve_device(requested, self.target, self.explicit)
            used = _ORIGINAL_DEVICE(device_type) if index is None else _ORIGINAL_DEVICE(device_type, index)
            cached = self._cache[requested] = (used, redirected, wrapped)
        used, redirected, wrapped = cached
        if redirected:
            self._record(requested, used, wrapped)
        return used

    def _on_the_cpu(self, requested):
        """Under a CPU override: the policy with the CPU as the named target, so accelerator
        requests mean the CPU and meta/lazy stay as they are (torch.compile traces on meta tensors;
        init_empty_weights and device="meta" must not allocate)."""
        used = self._cpu_cache.get(requested)
        if used is None:
            device_type, index, _, _ = _C.resolve_device(requested, "cpu", True)
            used = _ORIGINAL_DEVICE(device_type) if index is None else _ORIGINAL_DEVICE(device_type, index)
            self._cpu_cache[requested] = used
        return used

    def _record(self, requested, used, wrapped):
        key = f"{requested} -> {used}"
        self.redirected_calls[key] += 1
        if wrapped and requested not in self._warned_indices:
            self._warned_indices.add(requested)
            logger.warning("device %s does not exist here; using %s (index modulo the device count)",
                           requested, used)
        if logger.isEnabledFor(logging.INFO):
            site = _call_site()
            if (site, key) not in self._logged_sites:
                self._logged_sites.add((site, key))
                logger.info("%s: %s", site, key)

    def summary(self) -> str:
        total = sum(self.redirected_calls.values())
        parts = ", ".join(f"{k} ({n}x)" for k, n in self.redirected_calls.most_common())
        return f"redirected {total} device requests to '{self.target}'" + (f": {parts}" if parts else "")
