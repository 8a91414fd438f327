"""The Python Backend object over the C++ core."""

import functools
import importlib.util
import json
import os
import warnings

import torch

from .. import _C
from .device_info import DeviceInfo

_MB = 1024**2
#: The documented MB keys of get_memory_stats(), each from its byte-exact key.
_MB_KEYS = {"allocated": "allocated_bytes", "reserved": "reserved_bytes", "peak_allocated": "peak_allocated_bytes",
            "free": "free_bytes", "total": "total_bytes"}


# Backends the detection order ranks above TPUs (cuda > rocm > xpu > mps > tpu > SDK hardware > cpu).
_RANKED_ABOVE_TPU = ("cuda", "rocm", "xpu", "mps")


def detect_best_backend() -> str:
    """Name of the best available backend ("cuda", "rocm", "xpu", "mps", "tpu", an SDK device
    that declares real hardware, or "cpu"); ``TORCHBRIDGE_BACKEND`` overrides. Never falls back
    silently: an unknown or unavailable override raises.

    TPUs are detected here, not by the C++ core, which cannot reach torch_xla: without this, a
    TPU host detected "cpu"."""
    best = _C.detect_best_backend()
    if best in _RANKED_ABOVE_TPU or backend_named_in_environment():
        return best
    return "tpu" if _tpus_present() else best


def backend_named_in_environment() -> bool:
    """Whether TORCHBRIDGE_BACKEND names a backend ("auto", like unset, asks for detection)."""
    value = os.environ.get("TORCHBRIDGE_BACKEND", "").strip()
    return bool(value) and value.lower() != "auto"


@functools.lru_cache(maxsize=None)  # a process's hardware does not change; find_spec scans sys.path
def _tpus_present() -> bool:
    """Whether torch_xla is installed and its runtime drives TPUs (not XLA on a CPU or a GPU)."""
    if importlib.util.find_spec("torch_xla") is None:
        return False
    try:
        import torch_xla.runtime as xla_runtime
        return xla_runtime.device_type() == "TPU"
    except Exception as error:  # a broken install must not stop detection on a machine without TPUs
        warnings.warn(f"torch_xla is installed but could not say whether this machine has TPUs "
                      f"({type(error).__name__}: {error}); detecting without TPUs", stacklevel=3)
        return False


def memory_stats_with_mb(stats: dict) -> dict:
    """``stats`` (byte-exact keys) plus the documented MB keys; unknown stays None."""
    for key, byte_key in _MB_KEYS.items():
        value = stats.get(byte_key)
        stats[key] = None if value is None else value / _MB
    return stats


def check_optimization_level(level) -> str:
    """The canonical level name ("O0".."O3"); TypeError for a non-str, ValueError naming an
    unknown one. Parsing is the C++ core's (``torchbridge::parse_opt_level``)."""
    if not isinstance(level, str):
        raise TypeError(f"optimization_level must be a str, one of 'O0', 'O1', 'O2', 'O3'; got {level!r} "
                        f"({type(level).__name__})")
    return _C.parse_opt_level(level)


def check_device_index(index) -> int:
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"device_index must be an int (0 for the first device), got {index!r} ({type(index).__name__})")
    if not -2**31 <= index < 2**31:  # past C's int the core's binding said "incompatible function arguments"
        raise IndexError(f"device index {index} is out of range: device indices count from 0 to the device count")
    return index


def check_model(model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"prepare_model needs a torch.nn.Module, got {type(model).__name__}")


class Backend:
    """One backend (a vendor's devices, or the CPU). Create with :meth:`BackendFactory.create`
    or a vendor class such as ``torchbridge.backends.nvidia.NVIDIABackend()``.

    ``device_index`` picks the device this object works on; ``optimization_level`` ("O0".."O3")
    is the level :meth:`prepare_model` applies unless a call names another; O1-O3 run
    ``UnifiedManager`` on this backend (see :meth:`prepare_model`)."""

    #: Registry name a vendor subclass binds to; None for the generic class.
    backend_name = None

    def __init__(self, name: "str | None" = None, device_index: int = 0, optimization_level: str = "O0"):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"backend name must be a str such as 'cuda', got {name!r} ({type(name).__name__})")
        check_device_index(device_index)
        self._optimization_level = check_optimization_level(optimization_level)
        if name is None:
            raise ValueError("Backend needs a backend name, e.g. Backend('cuda')")
        self._native = _C.create(name)  # raises, with the reason, when unavailable
        if self._native.name == _C.registered_device():
            # Naming an SDK device loaded it in C++; torch's Python side needs to know it too.
            from .. import devices

            devices._integrate_with_torch(self._native.name)
        self._index = device_index
        self._native.device(device_index)  # validates the index

    def _checked_index(self, index) -> int:
        return self._index if index is None else check_device_index(index)

    # -- identity -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._native.name

    @property
    def device_index(self) -> int:
        return self._index

    @property
    def optimization_level(self) -> str:
        """The level :meth:`prepare_model` applies when a call names none."""
        return self._optimization_level

    @property
    def device(self) -> torch.device:
        """The torch.device this backend object works on."""
        return self.device_for(self._index)

    def device_for(self, index: int) -> torch.device:
        device_type, device_index = self._native.device(check_device_index(index))
        return torch.device(device_type) if device_index is None else torch.device(device_type, device_index)

    def device_count(self) -> int:
        return self._native.device_count()

    def is_available(self) -> bool:
        return self._native.is_available()

    # -- description ----------------------------------------------------------------------------
    def get_device_info(self, index: "int | None" = None) -> DeviceInfo:
        """The device's :class:`DeviceInfo`, built from the C++ core's DeviceInfo: the documented
        fields (``name``, ``backend``, ``memory_total_gb``, ``memory_available_gb``,
        ``compute_capability``, ``supported_dtypes`` as names) and the core's richer ones."""
        index = self._checked_index(index)
        return DeviceInfo.from_core_json(self._native.info_json(index), self.device_for(index).type)

    def get_memory_stats(self, index: "int | None" = None) -> dict:
        """The C++ MemoryStats as a dict: byte-exact keys (``allocated_bytes``, ``reserved_bytes``,
        ``peak_allocated_bytes``, ``free_bytes``, ``total_bytes``, ...), the documented keys in MB
        (``allocated``, ``reserved``, ``peak_allocated``, ``free``, ``total``; MB = 2**20 bytes,
        floats) and ``source``, where the numbers come from. A value the backend cannot measure is
        None in both forms (the table per backend is in docs/python-api.md)."""
        return memory_stats_with_mb(json.loads(self._native.memory_stats_json(self._checked_index(index))))

    def precision_policy(self, requested: str = "auto", index: "int | None" = None):
        """The precision ``requested`` ("auto" or fp64, fp32, tf32, bf16, fp16, fp8) resolves to on
        this device, with the reason and how the device runs every precision
        (``torchbridge.precision.PrecisionDecision``). A precision the device cannot compute
        raises ValueError naming the device and what it supports."""
        from ..precision import PrecisionDecision

        if not isinstance(requested, str):
            raise TypeError(f"precision must be a str such as 'auto' or 'bf16', got {requested!r}")
        return PrecisionDecision.from_json(_C.decide_precision(self.name, self._checked_index(index), requested))

    def supports_bf16(self) -> bool:
        return self.get_device_info().features.bf16

    def supports_fp16(self) -> bool:
        return self.get_device_info().features.fp16

    def supports_fp8(self) -> bool:
        return self.get_device_info().features.fp8

    def supports_tf32(self) -> bool:
        return self.get_device_info().features.tf32

    def supports_flash_attention(self) -> bool:
        return self.get_device_info().features.flash_attention

    # -- operations -----------------------------------------------------------------------------
    def empty_cache(self) -> None:
        self._native.empty_cache()

    def synchronize(self, index: "int | None" = None) -> None:
        self._native.synchronize(self._checked_index(index))

    def reset_peak_memory_stats(self, index: "int | None" = None) -> None:
        self._native.reset_peak_memory_stats(self._checked_index(index))

    def prepare_model(self, model: torch.nn.Module, optimization_level: "str | None" = None) -> torch.nn.Module:
        """Places ``model`` on this backend's device at ``optimization_level`` (None: the level
        this backend was constructed with) and returns the model to use. O1-O3 run
        ``UnifiedManager`` with this backend, precision "auto" and the model's own mode
        (``model.training``); use UnifiedManager directly for the report and other settings."""
        check_model(model)
        level = self._optimization_level if optimization_level is None else check_optimization_level(optimization_level)
        if level == "O0":
            return model.to(self.device)
        from ..config import TorchBridgeConfig
        from ..optimize import UnifiedManager

        config = TorchBridgeConfig(backend=self.name, device_index=self.device_index, optimization_level=level,
                                   training=model.training)
        return UnifiedManager(config).optimize(model)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, device={self.device}, "
                f"optimization_level={self._optimization_level!r})")


class VendorBackend(Backend):
    """Base of the per-vendor classes (``NVIDIABackend``, ``AMDBackend``, ...): the backend is the
    class's own, so the constructor takes only the device and the level."""

    def __init__(self, device_index: int = 0, optimization_level: str = "O0"):
        super().__init__(self.backend_name, device_index, optimization_level)


class BackendFactory:
    """Creates backends by name or alias (cuda|nvidia, rocm|hip|amd, xpu|intel, mps|apple,
    tpu|xla, cpu, or an SDK device name such as emu, which is loaded on request)."""

    @staticmethod
    def create(name: "str | None" = None, device_index: int = 0, optimization_level: str = "O0") -> Backend:
        """The backend called ``name``, or the best one (``detect_best_backend()``) when None, on
        device ``device_index``, preparing models at ``optimization_level``. Unknown names raise
        ValueError listing the valid ones; unavailable backends raise with the reason. Never a
        silent fallback to the CPU."""
        from . import registry

        if name is not None and not isinstance(name, str):
            raise TypeError(f"backend name must be a str such as 'cuda', got {name!r} ({type(name).__name__})")
        name = detect_best_backend() if name is None else name
        if registry.is_python_only(name):  # TPUs: served through torch_xla
            return registry.backend_class(name)(device_index=device_index, optimization_level=optimization_level)
        canonical = _C.lookup(name).name  # raises for unknown names; loads SDK devices
        cls = registry.backend_class(canonical)
        if cls is Backend:  # a PrivateUse1 device: the generic class, told its name
            return Backend(canonical, device_index, optimization_level)
        return cls(device_index=device_index, optimization_level=optimization_level)

    @staticmethod
    def available_backends() -> "list[str]":
        """Names of the backends usable in this process, best first."""
        return [n for n in _C.backend_names() if _C.lookup(n).is_available()]

    @staticmethod
    def names() -> "list[str]":
        """Every accepted name and alias."""
        return list(_C.valid_names())
