"""Mixed precision: ``GradScaler``, torch.amp.GradScaler's interface over TorchBridge's C++ GradScaler.

``torchbridge.amp.GradScaler`` takes the same arguments and has the same methods as
``torch.amp.GradScaler`` and produces bit-identical scales, skipped steps and parameters (tested
against it on the CPU and on emu). Unscaling, the inf/NaN checks, the skip decision, the scale
update and the state live in C++ (``include/torchbridge/amp/grad_scaler.h``); tensors reach it by
their TensorImpl address and are only changed in place there (``python/src/amp_bindings.cpp``
explains why). This module checks argument types, lists an optimizer's gradients and calls its
``step``; ``scale`` multiplies here because its result must carry autograd history into Python.

Differences from torch, all in argument checking: a non-positive or non-finite scale (given
to ``update`` as a float or as a one-element tensor, whose value is then read on the host),
``growth_interval <= 0`` and ``backoff_factor <= 0`` (which torch accepts) raise ``ValueError``
naming the value and the valid range, as do ``growth_factor <= 1`` and ``backoff_factor >= 1``
(torch: ``AssertionError``), also through the setters and ``load_state_dict``; wrong types raise
``TypeError``; ``load_state_dict`` refuses missing or extra keys. Optimizers that unscale inside
their own step (``fused=True``) are refused with ``NotImplementedError``.
"""

import math
import warnings

import torch

from . import _C

__all__ = ["GradScaler"]

_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
_FLOAT_KEYS = ("scale", "growth_factor", "backoff_factor")


def _is_real(value) -> bool:
    return isinstance(value, (float, int)) and not isinstance(value, bool)


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_real(name: str, value) -> float:
    if not _is_real(value):
        raise TypeError(f"GradScaler: {name} must be a float, got {value!r} ({type(value).__name__})")
    return float(value)


def _require_integer(name: str, value) -> int:
    if not _is_integer(value):
        raise TypeError(f"GradScaler: {name} must be an int, got {value!r} ({type(value).__name__})")
    return value


def _gradients(optimizer) -> "list[torch.Tensor]":
    grads = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not isinstance(param, torch.Tensor):
                raise AssertionError(f"expected param to be torch.Tensor, got {type(param).__name__}")
            if param.grad is not None:
                grads.append(param.grad)
    return grads


def _require_device_type(device) -> None:
    """torch's GradScaler keeps any string and fails only at its first scaled step, if at all."""
    if not isinstance(device, str):
        raise TypeError(f"GradScaler: device must be a device type such as 'cuda' or 'cpu', got {device!r} "
                        f"({type(device).__name__})")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"GradScaler: device {device!r} is not a device type torch knows (an SDK device is known "
                         "once torchbridge.devices.load names it)") from None
    if parsed.index is not None:  # torch's scaler compares the type string with tensors' device types
        raise ValueError(f"GradScaler: device {device!r} names a device; give its type, {parsed.type!r}")


def _check_new_scale_value(new_scale: torch.Tensor) -> None:
    """A one-element tensor given to update() holds what a float given to it may hold: a scale of
    0, below 0, inf or NaN was copied in, and with 0 the next steps were taken with gradients
    0 * inf = NaN that escaped the inf check, so the weights became NaN. Reading the value waits
    for the tensor's device, once per update(new_scale), which is called at most once per step."""
    if new_scale.is_complex() or new_scale.dtype == torch.bool:
        raise TypeError(f"GradScaler.update: new_scale must be a real number, got a {new_scale.dtype} tensor")
    given = new_scale.item()
    stored = new_scale.detach().to(torch.float32).item()  # the value the float32 scale receives
    if not (math.isfinite(stored) and stored > 0):
        given_is_valid = math.isfinite(given) and given > 0  # then it is the cast to float32 that broke it
        in_float32 = f", which is {stored} in the float32 scale" if given_is_valid else ""
        raise ValueError(f"GradScaler: new_scale must be a finite number > 0, got {given} "
                         f"(a {new_scale.dtype} tensor{in_float32})")


def _copy_may_be_asynchronous(device: torch.device) -> bool:
    """As grad_scaler.cpp's: the scale copied to the CPU is read by a CPU kernel at once, before a
    non_blocking copy from a device would have landed."""
    return device.type != "cpu"


class GradScaler:
    """Dynamic loss scaling, as ``torch.amp.GradScaler`` (same arguments, defaults and methods)."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"GradScaler: enabled must be a bool, got {enabled!r} ({type(enabled).__name__})")
        _require_device_type(device)
        self._device = device
        if device == "cuda" and enabled and not torch.cuda.is_available():
            warnings.warn("torchbridge.amp.GradScaler is enabled, but CUDA is not available.  Disabling.", stacklevel=2)
            enabled = False
        if enabled:
            init_scale = _require_real("init_scale", init_scale)
            growth_factor = _require_real("growth_factor", growth_factor)
            backoff_factor = _require_real("backoff_factor", backoff_factor)
            growth_interval = _require_integer("growth_interval", growth_interval)
        else:  # like torch, a disabled scaler ignores its other arguments
            init_scale, growth_factor, backoff_factor, growth_interval = 2.0**16, 2.0, 0.5, 2000
        self._build(enabled, init_scale, growth_factor, backoff_factor, growth_interval)

    def _build(self, enabled: bool, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
               growth_interval=2000) -> None:
        self._core = _C._GradScaler(init_scale=init_scale, growth_factor=growth_factor,
                                    backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
        self._enabled = enabled
        # The scale and growth tracker, allocated here on the first scaled tensor's device and
        # owned jointly with the C++ scaler, which updates them in place.
        self._scale: "torch.Tensor | None" = None
        self._growth_tracker: "torch.Tensor | None" = None

    def _ensure_scale(self, device: torch.device) -> torch.Tensor:
        if self._scale is None:
            scale = torch.empty((), dtype=torch.float32, device=device)
            tracker = torch.empty((), dtype=torch.int32, device=device)
            self._core.adopt_state_tensors(scale._cdata, tracker._cdata)  # fills them with the initial values
            self._scale, self._growth_tracker = scale, tracker
        return self._scale

    def scale(self, outputs):
        """``outputs`` (a tensor or nested lists/tuples/iterables of tensors) times the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs * self._ensure_scale(outputs.device).to(device=outputs.device,
                                                                    non_blocking=_copy_may_be_asynchronous(outputs.device))
        copies: "dict[torch.device, torch.Tensor]" = {}  # one copy per device for the whole structure

        def apply(value):
            if isinstance(value, torch.Tensor):
                scale = copies.get(value.device)
                if scale is None:
                    scale = self._ensure_scale(value.device).to(device=value.device, copy=True,
                                                                non_blocking=_copy_may_be_asynchronous(value.device))
                    copies[value.device] = scale
                return value * scale
            if isinstance(value, (list, tuple)):
                return type(value)(map(apply, value))
            if hasattr(value, "__iter__"):
                return map(apply, value)
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply(outputs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divides ``optimizer``'s gradients by the scale in place (at most once per step)."""
        if not self._enabled:
            return
        grads = _gradients(optimizer)  # held here while C++ uses them by address
        self._core.unscale_(id(optimizer), [g._cdata for g in grads])

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        """Unscales (unless ``unscale_`` ran) and calls ``optimizer.step(*args, **kwargs)`` unless a
        gradient is inf/NaN; returns what the step returned, or None when it was skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            raise NotImplementedError(
                f"torchbridge.amp.GradScaler: {type(optimizer).__name__} unscales inside its own step (fused=True); "
                "construct it with fused=False, or use torch.amp.GradScaler for fused optimizers")
        grads = _gradients(optimizer)
        retval = None
        if self._core.prepare_step(id(optimizer), [g._cdata for g in grads]):
            retval = optimizer.step(*args, **kwargs)
        self._core.finish_step(id(optimizer))
        return retval

    def update(self, new_scale: "float | torch.Tensor | None" = None) -> None:
        """Backs the scale off after a skipped step, grows it after ``growth_interval`` clean steps,
        or sets it to ``new_scale`` (a float or a one-element tensor; a tensor's value is read to
        check it, which waits for its device)."""
        if not self._enabled:
            return
        if new_scale is None:
            self._core.update()
        elif isinstance(new_scale, float):
            self._core.update_to_float(new_scale)
        elif isinstance(new_scale, torch.Tensor):
            if self._scale is not None:  # else the C++ update raises torch's "_scale is None" error
                self._check_new_scale_tensor(new_scale)
            self._core.update_to_tensor(new_scale._cdata)
        else:
            raise TypeError(f"GradScaler.update: new_scale must be a float or a 1-element tensor, got {new_scale!r} "
                            f"({type(new_scale).__name__})")

    def _check_new_scale_tensor(self, new_scale: torch.Tensor) -> None:
        # The scale is copied in place, so new_scale must be on the scale's device type: where the
        # scale is, not the type given to the constructor, which differs under redirection
        # ("cuda" tensors live on the target) and when scale() met tensors of another type.
        if new_scale.device.type != self._scale.device.type:
            raise AssertionError("new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                                 "torch.FloatTensor with requires_grad=False; it is on a "
                                 f"'{new_scale.device.type}' device, the scale on a "
                                 f"'{self._scale.device.type}' device.")
        if new_scale.numel() != 1 or new_scale.requires_grad:
            return  # the C++ update raises torch's AssertionError for these, as torch's own checks come first
        _check_new_scale_value(new_scale)

    def get_scale(self) -> float:
        return self._core.get_scale()

    def get_growth_factor(self) -> float:
        return self._core.get_growth_factor()

    def set_growth_factor(self, new_factor: float) -> None:
        self._core.set_growth_factor(_require_real("growth_factor", new_factor))

    def get_backoff_factor(self) -> float:
        return self._core.get_backoff_factor()

    def set_backoff_factor(self, new_factor: float) -> None:
        self._core.set_backoff_factor(_require_real("backoff_factor", new_factor))

    def get_growth_interval(self) -> int:
        return self._core.get_growth_interval()

    def set_growth_interval(self, new_interval: int) -> None:
        self._core.set_growth_interval(_require_integer("growth_interval", new_interval))

    def _get_growth_tracker(self) -> int:
        return self._core.growth_tracker()

    def is_enabled(self) -> bool:
        return self._enabled

    # Pickling (copy.deepcopy, multiprocessing) as torch's scaler pickles: its settings and current
    # scale, the scale tensor recreated at the first scale() after. The C++ core itself cannot be
    # pickled, so it is rebuilt from them.
    def __getstate__(self) -> "dict":
        if self._enabled and self._core.step_in_progress():
            raise AssertionError("A GradScaler instance may only be pickled at the beginning of an iteration, or at "
                                 "the end after scaler.update().")
        return {"device": self._device, "enabled": self._enabled, "state": self.state_dict()}

    def __setstate__(self, state: "dict") -> None:
        # Not through __init__: its device check would refuse an SDK device this process has not
        # loaded yet (yet, or at all), where torch's scaler unpickles and fails only when used.
        self._device = state["device"]
        self._build(state["enabled"])
        if self._enabled:
            self.load_state_dict(state["state"])

    def state_dict(self) -> "dict":
        """``{"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}`` as
        torch writes it; ``{}`` when disabled."""
        state = self._core.state_dict()
        return {} if state is None else dict(zip(_STATE_KEYS, state))

    def load_state_dict(self, state_dict: "dict") -> None:
        """Loads a state from ``state_dict()`` of this class or of torch.amp.GradScaler."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"GradScaler.load_state_dict: expected a dict, got {type(state_dict).__name__}")
        if len(state_dict) == 0:
            self._core.load_state_dict(None)  # raises torch's error for a disabled scaler's state
        expected = ", ".join(_STATE_KEYS)
        for key in _STATE_KEYS:
            if key not in state_dict:
                raise ValueError(f"GradScaler state dict is missing the key '{key}' (expected exactly the keys {expected})")
        for key in state_dict:
            if key not in _STATE_KEYS:
                raise ValueError(f"GradScaler state dict has the unexpected key {key!r} (expected exactly the keys "
                                 f"{expected})")
        for key in _STATE_KEYS:
            value = state_dict[key]
            if key in _FLOAT_KEYS:
                if not _is_real(value):
                    raise TypeError(f"GradScaler state dict: '{key}' must be a float, got {value!r} "
                                    f"({type(value).__name__})")
            elif not _is_integer(value):
                raise TypeError(f"GradScaler state dict: '{key}' must be an int, got {value!r} ({type(value).__name__})")
        self._core.load_state_dict(tuple(float(state_dict[k]) if k in _FLOAT_KEYS else state_dict[k]
                                         for k in _STATE_KEYS))
