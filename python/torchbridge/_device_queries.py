"""The queries programs make of torch.cuda, on the torch.<name> module of an SDK device: device
name and properties, memory statistics and the per-process memory fraction, bfloat16 support
(streams: _device_streams). Properties come from the C++ backend's DeviceInfo (the runtime's own
description); memory from torch.accelerator, which reads the SDK's caching allocator in C++ and
never calls back into this module."""

import dataclasses
import json

import torch

from . import _C


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What torch.cuda.get_device_properties answers, for an SDK device (multi_processor_count is
    0 when the runtime does not report one; is_integrated: the device computes on host memory)."""

    name: str
    vendor: str
    architecture: str
    driver_version: str
    total_memory: int
    multi_processor_count: int
    is_integrated: bool


def add_queries(module, name: str, index) -> None:
    """Adds the queries to `module`; index(device) turns None/int/str/torch.device into an index."""

    def info(device=None) -> dict:
        return json.loads(_C.lookup(name).info_json(index(device)))

    def get_device_name(device=None) -> str:
        return info(device)["name"]

    def get_device_properties(device=None) -> DeviceProperties:
        described = info(device)
        return DeviceProperties(name=described["name"], vendor=described["vendor"] or "",
                                architecture=described["architecture"] or "",
                                driver_version=described["driver_version"] or "",
                                total_memory=described["total_memory_bytes"] or 0,
                                multi_processor_count=described["multiprocessor_count"] or 0,
                                is_integrated=bool(described["features"]["unified_memory"]))

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        from .precision import computes

        return computes("bf16", name, index(None), including_emulation)

    def mem_get_info(device=None):
        stats = json.loads(_C.lookup(name).memory_stats_json(index(device)))
        return stats["free_bytes"], stats["total_bytes"]

    def set_per_process_memory_fraction(fraction, device=None) -> None:
        """Caps what this process may reserve on the device at ``fraction`` (0 to 1) of its memory,
        as torch.cuda's does: past the cap an allocation raises torch.OutOfMemoryError."""
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise TypeError(f"fraction must be a number from 0 to 1, got {fraction!r}")
        _C.sdk_set_memory_fraction(float(fraction), index(device))

    def get_per_process_memory_fraction(device=None) -> float:
        return _C.sdk_memory_fraction(index(device))

    for query in (get_device_name, get_device_properties, is_bf16_supported, mem_get_info,
                  set_per_process_memory_fraction, get_per_process_memory_fraction):
        setattr(module, query.__name__, query)

    # torch.accelerator's memory statistics, under torch.cuda's names and with its device argument.
    def by_device(function):
        def query(device=None):
            return function(index(device))

        query.__name__ = function.__name__
        query.__doc__ = function.__doc__
        return query

    memory = torch.accelerator
    for function in (memory.memory_allocated, memory.max_memory_allocated, memory.memory_reserved,
                     memory.max_memory_reserved, memory.memory_stats, memory.reset_peak_memory_stats,
                     memory.reset_accumulated_memory_stats):
        setattr(module, function.__name__, by_device(function))
    module.empty_cache = memory.empty_cache
