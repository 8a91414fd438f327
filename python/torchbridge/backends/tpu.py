"""Google TPUs through torch_xla (the C++ core cannot reach them)."""

import torch

from .base import check_device_index, check_model, check_optimization_level, memory_stats_with_mb
from .device_info import DeviceInfo

_NO_DESCRIPTION = ("the precision table is the C++ core's, which cannot describe TPUs (torch_xla is "
                   "Python-only); choose a precision for torch_xla yourself (TPUs compute bfloat16)")
_MISSING = (
    "TPUBackend needs the torch_xla package, which is not installed here "
    "(TPUs are driven through torch_xla: pip install torch_xla)"
)


def _xla():
    try:
        import torch_xla  # noqa: F401
        import torch_xla.core.xla_model as xm
    except ImportError as error:
        raise RuntimeError(_MISSING) from error
    return xm


class TPUBackend:
    """TPU devices through torch_xla. Raises a clear error naming the missing package when
    torch_xla is not installed. ``device_index`` and ``optimization_level`` as for the other
    backends, but only O0 runs: O1-O3 raise NotImplementedError (see prepare_model)."""

    backend_name = "tpu"

    def __init__(self, device_index: int = 0, optimization_level: str = "O0"):
        check_device_index(device_index)
        self._optimization_level = check_optimization_level(optimization_level)
        self._xm = _xla()
        self._devices = self._xm.get_xla_supported_devices()
        if not self._devices:
            raise RuntimeError("torch_xla is installed but reports no TPU device")
        self._index = self._checked_index(device_index)

    @property
    def name(self) -> str:
        return "tpu"

    @property
    def device_index(self) -> int:
        return self._index

    @property
    def optimization_level(self) -> str:
        return self._optimization_level

    @property
    def device(self) -> torch.device:
        return torch.device(self._devices[self._index])

    def device_for(self, index: int) -> torch.device:
        return torch.device(self._devices[self._checked_index(index)])

    def device_count(self) -> int:
        return len(self._devices)

    def is_available(self) -> bool:
        return True

    def _checked_index(self, index) -> int:
        """``index`` (None: this backend's device) as Backend checks it: an int within range."""
        if index is None:
            return self._index
        check_device_index(index)
        if index >= len(self._devices):
            raise IndexError(f"device index {index} is out of range for backend 'tpu', which has "
                             f"{len(self._devices)} devices (valid indices: 0..{len(self._devices) - 1})")
        return index

    def get_memory_stats(self, index: "int | None" = None) -> dict:
        """torch_xla's own numbers; the byte keys and the documented MB keys. torch_xla reports no
        reserved figure (None), and a peak only in versions that have ``peak_bytes_used``."""
        memory = self._xm.get_memory_info(self.device_for(index) if index is not None else self.device)
        used, limit = memory.get("bytes_used"), memory.get("bytes_limit")
        return memory_stats_with_mb({
            "allocated_bytes": used, "reserved_bytes": None,
            "peak_allocated_bytes": memory.get("peak_bytes_used"), "total_bytes": limit,
            "free_bytes": None if used is None or limit is None else limit - used,
            "source": "torch_xla.core.xla_model.get_memory_info"})

    def get_device_info(self, index: "int | None" = None) -> DeviceInfo:
        """What torch_xla tells: the device name and its memory. The dtypes a TPU computes and its
        architecture are not reported by torch_xla, so they are None (unknown)."""
        index = self._checked_index(index)
        stats = self.get_memory_stats(index)
        total, free = stats["total_bytes"], stats["free_bytes"]
        return DeviceInfo(name=self._devices[index], backend="tpu",
                          memory_total_gb=None if total is None else total / 1024**3,
                          memory_available_gb=None if free is None else free / 1024**3,
                          compute_capability=None, supported_dtypes=None, vendor="Google", index=index,
                          device_type=self.device.type, total_memory_bytes=total, free_memory_bytes=free)

    def synchronize(self, index: "int | None" = None) -> None:
        """Waits for every device's work: torch_xla waits for all devices, not one."""
        self._checked_index(index)
        self._xm.wait_device_ops()

    # What Backend offers beyond this needs what torch_xla does not give: a device description the
    # C++ precision policy reads, a peak to reset, a cache to empty. Each says so rather than
    # answering something made up, or being missing (AttributeError).
    def _not_for_tpus(self, what: str, why: str):
        raise NotImplementedError(f"TPUBackend.{what} is not available for TPUs: {why}")

    def precision_policy(self, requested: str = "auto", index: "int | None" = None):
        self._not_for_tpus("precision_policy", _NO_DESCRIPTION)

    def supports_bf16(self) -> bool:
        self._not_for_tpus("supports_bf16", _NO_DESCRIPTION)

    def supports_fp16(self) -> bool:
        self._not_for_tpus("supports_fp16", _NO_DESCRIPTION)

    def supports_fp8(self) -> bool:
        self._not_for_tpus("supports_fp8", _NO_DESCRIPTION)

    def supports_tf32(self) -> bool:
        self._not_for_tpus("supports_tf32", _NO_DESCRIPTION)

    def supports_flash_attention(self) -> bool:
        self._not_for_tpus("supports_flash_attention", _NO_DESCRIPTION)

    def empty_cache(self) -> None:
        self._not_for_tpus("empty_cache", "torch_xla keeps no cache of device memory that a program can empty")

    def reset_peak_memory_stats(self, index: "int | None" = None) -> None:
        self._not_for_tpus("reset_peak_memory_stats", "torch_xla offers no reset of its peak (peak_bytes_used)")

    def prepare_model(self, model: torch.nn.Module, optimization_level: "str | None" = None) -> torch.nn.Module:
        check_model(model)
        level = self._optimization_level if optimization_level is None else check_optimization_level(optimization_level)
        if level != "O0":
            # The optimization plan decides from the C++ DeviceInfo, and the C++ core cannot
            # describe TPUs (torch_xla is Python-only); running O0 instead would be a silent downgrade.
            raise NotImplementedError(f"optimization level {level} is not available for TPUs: the precision policy "
                                      "needs a device description the C++ core cannot read through torch_xla; use O0 "
                                      "and torch_xla's own tools")
        return model.to(self.device)
