"""The Python Backend object over the C++ core."""

import json

import torch

from .. import _C

_GB = 1024**3


def detect_best_backend() -> str:
    """Name of the best available backend ("cuda", "rocm", "xpu", "mps", "tpu", an SDK device
    that declares real hardware, or "cpu"); ``TORCHBRIDGE_BACKEND`` overrides. Never falls back
    silently: an unknown or unavailable override raises."""
    return _C.detect_best_backend()


class Backend:
    """One backend (a vendor's devices, or the CPU). Create with :meth:`BackendFactory.create`
    or a vendor class such as ``torchbridge.backends.nvidia.NVIDIABackend()``."""

    #: Registry name a vendor subclass binds to; None for the generic class.
    backend_name = None

    def __init__(self, name: "str | None" = None, device_index: int = 0):
        name = name or self.backend_name
        if name is None:
            raise ValueError("Backend needs a backend name, e.g. Backend('cuda')")
        self._native = _C.create(name)  # raises, with the reason, when unavailable
        if self._native.name == _C.registered_device():
            # Naming an SDK device loaded it in C++; torch's Python side needs to know it too.
            from .. import devices

            devices._integrate_with_torch(self._native.name)
        self._index = device_index
        self._native.device(device_index)  # validates the index

    # -- identity -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._native.name

    @property
    def device(self) -> torch.device:
        """The torch.device this backend object works on."""
        return self.device_for(self._index)

    def device_for(self, index: int) -> torch.device:
        device_type, device_index = self._native.device(index)
        return torch.device(device_type) if device_index is None else torch.device(device_type, device_index)

    def device_count(self) -> int:
        return self._native.device_count()

    def is_available(self) -> bool:
        return self._native.is_available()

    # -- description ----------------------------------------------------------------------------
    def get_device_info(self, index: "int | None" = None) -> dict:
        """The C++ DeviceInfo as a dict, plus the keys users of the original TorchBridge know:
        ``memory_total_gb``, ``memory_available_gb``, ``compute_capability`` and
        ``supported_dtypes`` as torch dtypes (``supported_dtype_names`` keeps the strings)."""
        info = json.loads(self._native.info_json(self._index if index is None else index))
        total, free = info["total_memory_bytes"], info["free_memory_bytes"]
        info["memory_total_gb"] = None if total is None else total / _GB
        info["memory_available_gb"] = None if free is None else free / _GB
        info["compute_capability"] = info["architecture"]
        info["device_type"] = self.device.type
        info["supported_dtype_names"] = list(info["supported_dtypes"])
        info["supported_dtypes"] = [getattr(torch, n) for n in info["supported_dtypes"] if hasattr(torch, n)]
        return info

    def get_memory_stats(self, index: "int | None" = None) -> dict:
        """The C++ MemoryStats as a dict; ``source`` says where the numbers come from and a value
        the source cannot give is None."""
        return json.loads(self._native.memory_stats_json(self._index if index is None else index))

    def supports_bf16(self) -> bool:
        return self.get_device_info()["features"]["bf16"]

    def supports_fp16(self) -> bool:
        return self.get_device_info()["features"]["fp16"]

    def supports_fp8(self) -> bool:
        return self.get_device_info()["features"]["fp8"]

    def supports_tf32(self) -> bool:
        return self.get_device_info()["features"]["tf32"]

    def supports_flash_attention(self) -> bool:
        return self.get_device_info()["features"]["flash_attention"]

    # -- operations -----------------------------------------------------------------------------
    def empty_cache(self) -> None:
        self._native.empty_cache()

    def synchronize(self, index: "int | None" = None) -> None:
        self._native.synchronize(self._index if index is None else index)

    def reset_peak_memory_stats(self, index: "int | None" = None) -> None:
        self._native.reset_peak_memory_stats(self._index if index is None else index)

    def prepare_model(self, model: torch.nn.Module, optimization_level: str = "O0") -> torch.nn.Module:
        """Places ``model`` on this backend's device. Only O0 exists so far; O1-O3 raise
        NotImplementedError instead of silently running O0."""
        _C.require_supported_opt_level(optimization_level)
        return model.to(self.device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device={self.device})"


class BackendFactory:
    """Creates backends by name or alias (cuda|nvidia, rocm|hip|amd, xpu|intel, mps|apple,
    tpu|xla, cpu, or an SDK device name such as emu, which is loaded on request)."""

    @staticmethod
    def create(name: "str | None" = None, device_index: int = 0) -> Backend:
        """The backend called ``name``, or the best one (``detect_best_backend()``) when None.
        Unknown names raise ValueError listing the valid ones; unavailable backends raise with
        the reason. Never a silent fallback to the CPU."""
        from . import registry

        name = detect_best_backend() if name is None else name
        if registry.is_python_only(name):  # TPUs: served through torch_xla
            return registry.backend_class(name)(device_index=device_index)
        canonical = _C.lookup(name).name  # raises for unknown names; loads SDK devices
        return registry.backend_class(canonical)(canonical, device_index)

    @staticmethod
    def available_backends() -> "list[str]":
        """Names of the backends usable in this process, best first."""
        return [n for n in _C.backend_names() if _C.lookup(n).is_available()]

    @staticmethod
    def names() -> "list[str]":
        """Every accepted name and alias."""
        return list(_C.valid_names())
