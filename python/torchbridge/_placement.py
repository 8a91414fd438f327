"""Where and in which dtype restored tensors go: the device map and the dtype policy of
``checkpoint.load_state``, with the same meaning as the C++ ``RestoreOptions``
(include/torchbridge/checkpoint/training_state.h)."""

import json
from typing import Callable

import torch

from . import _C
from .backends.base import detect_best_backend

# Every float8 dtype this torch has (e4m3fn, e5m2, their fnuz variants, e8m0 scales).
_FP8 = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                               "float8_e8m0fnu") if hasattr(torch, name))


# ---- device map -----------------------------------------------------------------------------------
def parse_device_map(device_map, tensor_bytes: "list[tuple[str, int]]") -> "list[tuple[str, torch.device]]":
    """(prefix, device) pairs from ``None`` (no map: tensors stay where the model has them), a
    ``{module-name prefix: device}`` dict, ``"auto"`` (the best backend's devices) or
    ``"auto:<backend>"``. ``tensor_bytes`` lists (name, bytes) in model order for the auto map.
    Every device is checked to exist here, so a bad map fails before anything is loaded."""
    if device_map is None:
        return []
    if isinstance(device_map, str):
        if device_map != "auto" and not device_map.startswith("auto:"):
            raise ValueError(f"device_map {device_map!r}: expected a dict {{prefix: device}}, 'auto' or "
                             "'auto:<backend>'")
        backend = device_map[len("auto:"):] if device_map.startswith("auto:") else detect_best_backend()
        if not backend:
            raise ValueError("device_map 'auto:' names no backend (e.g. 'auto:cuda')")
        if backend in ("tpu", "xla"):
            # The C++ core reads the free memory the map is made from, and it cannot reach TPUs.
            raise ValueError(f"device_map {device_map!r}: the auto map spreads modules by free memory, which "
                             f"TorchBridge cannot read on TPUs; pass a dict such as {{'': 'xla:0'}}, or 'auto:cpu'")
        # The same placement the C++ restore computes: top-level modules in order, spread over the
        # backend's devices in proportion to their free memory.
        pairs = [(prefix, torch.device(device)) for prefix, device in _C.auto_device_map(tensor_bytes, backend)]
    elif isinstance(device_map, dict):
        pairs = []
        for prefix, device in device_map.items():
            if not isinstance(prefix, str):
                raise TypeError(f"device_map keys are module-name prefixes (str), got {prefix!r}")
            pairs.append((prefix, _parse_device(device, f"device_map[{prefix!r}]")))
    else:
        raise TypeError(f"device_map must be None, a dict or 'auto', got {type(device_map).__name__}")
    for prefix, device in pairs:
        _check_device_exists(device, f"device_map[{prefix!r}]")
    return pairs


def _parse_device(value, where: str) -> torch.device:
    if isinstance(value, torch.device):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{where}: expected a device string such as 'cpu' or 'cuda:0', got {value!r}")
    try:
        return torch.device(value)
    except RuntimeError as error:
        raise ValueError(f"{where}: {value!r} is not a device ({error})") from None


def _check_device_exists(device: torch.device, where: str) -> None:
    if device.type == "cpu":
        if device.index not in (None, 0):
            raise ValueError(f"{where}: {device} does not exist (the CPU is device 'cpu')")
        return
    try:
        count = torch.get_device_module(device.type).device_count()
    except (AttributeError, RuntimeError):
        count = 0
    if count == 0:
        raise ValueError(f"{where}: {device} is not available in this process (no {device.type} devices)")
    if device.index is not None and device.index >= count:
        raise ValueError(f"{where}: {device} does not exist ({count} {device.type} devices)")


def device_for(name: str, device_map: "list[tuple[str, torch.device]]", current: torch.device) -> torch.device:
    """The device of the longest prefix matching ``name`` as a module path ("enc" matches
    "enc.weight" and "enc", not "encoder.weight"; "" matches all), else ``current``. A trailing dot,
    as the auto map writes ("enc."), is accepted."""
    best, best_length = current, -1
    for prefix, device in device_map:
        module = prefix[:-1] if prefix.endswith(".") else prefix
        matches = module == "" or name == module or name.startswith(module + ".")
        if matches and len(module) > best_length:
            best, best_length = device, len(module)
    return best


# ---- dtype policy ---------------------------------------------------------------------------------
class DtypePolicy:
    """``"keep"`` (saved dtypes), ``"cast:<dtype>"`` (every floating-point tensor to that dtype) or
    ``"convert_unsupported"`` (only bf16/fp16/fp8 the target device cannot hold: fp8 to bf16 where
    the device has it, else fp32; the rest to fp32). Integer and bool tensors never change."""

    def __init__(self, spec):
        if not isinstance(spec, str):
            raise TypeError(f"dtype_policy must be a string ('keep', 'cast:<dtype>', 'convert_unsupported'), "
                            f"got {type(spec).__name__}")
        self.kind, self.cast_to = spec, None
        if spec.startswith("cast:"):
            name = spec[len("cast:"):].removeprefix("torch.")
            dtype = getattr(torch, name, None) if name else None
            if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
                raise ValueError(f"dtype_policy {spec!r}: {name!r} is not a floating-point torch dtype "
                                 "(e.g. 'cast:float32', 'cast:bfloat16')")
            self.kind, self.cast_to = "cast", dtype
        elif spec not in ("keep", "convert_unsupported"):
            raise ValueError(f"dtype_policy {spec!r}: expected 'keep', 'cast:<dtype>' or 'convert_unsupported'")
        self._held: "dict[torch.device, set[str]]" = {}

    def dtype_for(self, saved: torch.dtype, device: torch.device) -> torch.dtype:
        if not saved.is_floating_point or self.kind == "keep":
            return saved
        if self.kind == "cast":
            return self.cast_to
        if saved not in (torch.bfloat16, torch.float16, *_FP8) or self._holds(device, saved):
            return saved
        return torch.bfloat16 if saved in _FP8 and self._holds(device, torch.bfloat16) else torch.float32

    def _holds(self, device: torch.device, dtype: torch.dtype) -> bool:
        # What the hardware computes, as the backend describes it (the C++ DeviceInfo).
        if device not in self._held:
            info = json.loads(_C.lookup(device.type).info_json(device.index or 0))
            self._held[device] = set(info["supported_dtypes"])
        return str(dtype).removeprefix("torch.") in self._held[device]


def _dequantize(value: torch.Tensor, factor: torch.Tensor, name: str, factor_name: str) -> torch.Tensor:
    # Per tensor or per row/column: a factor that broadcasts to the weight without widening it.
    if factor.dim() <= value.dim() and all(f in (1, v) for f, v in zip(reversed(factor.shape), reversed(value.shape))):
        return value * factor
    # Block-wise factors (DeepSeek-V3, transformers' fine-grained FP8): one per block of a 2-D
    # weight. The file does not say the block size; like transformers, take it as the weight's
    # size over the factor grid's, which must divide evenly.
    if (value.dim() == 2 and factor.dim() == 2 and factor.numel() > 0
            and value.shape[0] % factor.shape[0] == 0 and value.shape[1] % factor.shape[1] == 0):
        blocks = factor.repeat_interleave(value.shape[0] // factor.shape[0], 0)
        return value * blocks.repeat_interleave(value.shape[1] // factor.shape[1], 1)
    raise ValueError(f"cannot dequantize {name!r} of shape {list(value.shape)} with {factor_name!r} of shape "
                     f"{list(factor.shape)}: expected a factor that broadcasts to the weight or a 2-D grid of "
                     f"blocks that divides it evenly")


def widen(saved: torch.Tensor, dtype: torch.dtype, stored_tensor: "Callable[[str], torch.Tensor | None]",
          name: str = "tensor") -> "tuple[torch.Tensor, str | None]":
    """``saved`` in ``dtype``, and the name of the factor applied, if any: an fp8 tensor becoming
    wider is multiplied by its stored dequantization factor, ``stored_tensor(name + suffix)`` for
    the first suffix of ``_C.fp8_scale_suffixes`` (``_scale``, ``_scale_inv``; the C++
    ``kFp8ScaleSuffixes`` says whose files use which) that the file holds. Per tensor, per row, or
    per block of a 2-D weight."""
    if saved.dtype not in _FP8 or dtype in _FP8:
        return saved.to(dtype), None
    value = saved.to(torch.float32)
    for suffix in _C.fp8_scale_suffixes:
        factor = stored_tensor(name + suffix)
        if factor is not None:
            return _dequantize(value, factor.to(torch.float32), name, name + suffix).to(dtype), name + suffix
    return value.to(dtype), None
