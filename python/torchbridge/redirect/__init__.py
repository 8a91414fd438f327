"""Transparent redirection: code written for CUDA runs unmodified on the accelerator this machine
has. ``enable()`` patches torch so that requests for a missing accelerator type (cuda, mps,
xpu, ...) go to the target (``TORCHBRIDGE_BACKEND`` or ``detect_best_backend()``), ``cpu`` stays
the CPU, ``cpu:-1`` forces the CPU, and device indices wrap onto the devices that exist.
``disable()`` restores every patched attribute exactly. The policy itself is C++
(``torchbridge::resolve_device``)."""

import atexit
import contextlib

import torch

from .. import _C, devices
from ..backends import detect_best_backend
from ..backends.base import backend_named_in_environment
from ._patcher import Patcher
from ._redirector import Redirector, configure_logging, logger

_active = None  # (Redirector, Patcher) while enabled


def enable(target: "str | None" = None) -> str:
    """Turns redirection on towards ``target`` (a backend name; default ``TORCHBRIDGE_BACKEND`` or
    ``detect_best_backend()``). Naming an SDK device loads it. Returns the target's name.

    A named target (the argument or ``TORCHBRIDGE_BACKEND``) takes every accelerator request, also
    for devices this machine has: ``TORCHBRIDGE_BACKEND=cpu`` on a CUDA machine runs on the CPU.
    A detected target takes only the requests for accelerators this process cannot use."""
    global _active
    if _active is not None:
        raise RuntimeError(f"redirection is already enabled (target '{_active[0].target}'); disable() it first")
    configure_logging()
    explicit = target is not None or backend_named_in_environment()
    name = _C.lookup(target or detect_best_backend()).name  # raises for unknown names
    status, reason = _C.lookup(name).availability()
    if status != "available":
        raise RuntimeError(f"cannot redirect to '{name}': {reason}")
    if name == _C.registered_device():
        devices._integrate_with_torch(name)
    redirector, patcher = Redirector(name, explicit), Patcher()
    from . import _patches

    try:
        _patches.install(redirector, patcher)
    except BaseException:
        patcher.restore_all()
        raise
    _active = (redirector, patcher)
    logger.info("redirecting accelerator requests to '%s'", name)
    return name


def disable() -> None:
    """Turns redirection off, restoring every patched attribute to the very object it was."""
    global _active
    if _active is None:
        return
    redirector, patcher = _active
    _active = None
    patcher.restore_all()
    logger.info("%s", redirector.summary())


def is_enabled() -> bool:
    return _active is not None


def resolve(device) -> torch.device:
    """Where ``device`` goes under the active redirection (or under detection when inactive)."""
    if _active is not None:
        return _active[0].resolve(device)
    explicit = backend_named_in_environment()
    return Redirector(detect_best_backend(), explicit).resolve(device)


@contextlib.contextmanager
def redirected(target: "str | None" = None):
    """``with redirected("emu"): ...`` enables redirection for the block."""
    enable(target)
    try:
        yield
    finally:
        disable()


@contextlib.contextmanager
def cpu():
    """Within the block every accelerator request means the CPU (like the string ``cpu:-1``);
    cpu, meta and lazy requests stay what they are, as without it."""
    if _active is None:
        yield
        return
    redirector = _active[0]
    redirector.push_cpu()
    try:
        yield
    finally:
        redirector.pop_cpu()


@atexit.register
def _summary_at_exit():
    if _active is not None:
        logger.info("%s", _active[0].summary())


__all__ = ["enable", "disable", "is_enabled", "resolve", "redirected", "cpu"]
