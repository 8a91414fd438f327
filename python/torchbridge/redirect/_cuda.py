"""Replacements for the torch.cuda namespace, answered by the redirection target with its real
properties, memory statistics, streams, events and generators."""

import contextlib
import itertools
import types

import torch

from ..backends import BackendFactory
from ..backends.device_info import cuda_capability
from ..precision import computes
from . import _cuda_native, _cuda_unavailable
from ._host import DEFAULT_HOST_STREAM, HostEvent, HostStream, current_host_stream, set_current_host_stream
from ._proxy import proxy_class
from ._target_stream import TargetStream, as_target_stream


def build(redirector):
    """A {name: replacement} map for torch.cuda, and the device type of the target."""
    target = BackendFactory.create(redirector.target)
    if target.device.type == "cuda":  # torch.cuda is the target's own namespace: kept, not replaced
        return _cuda_native.replacements(redirector), "cuda"
    original_memory_summary = torch.cuda.memory.memory_summary
    device_type = target.device.type
    on_cpu = device_type == "cpu"
    device_module = None if on_cpu else getattr(torch, device_type)

    def index_of(device=None) -> int:
        if on_cpu:
            return 0
        if device is None:
            return device_module.current_device()
        resolved = redirector.resolve(device)
        return resolved.index if resolved.index is not None else device_module.current_device()

    def device_count():
        return target.device_count()

    def current_device():
        return index_of()

    def set_device(device):
        # A negative index is a no-op, as torch documents (set_device(local_rank) with its default -1).
        if isinstance(device, int) and not isinstance(device, bool) and device < 0:
            return
        if not on_cpu:
            device_module.set_device(index_of(device))

    class device:
        """torch.cuda.device for the target. A class, as torch's: its own code (the memory
        functions, DataParallel) asks isinstance(x, torch.cuda.device) and reads x.idx."""

        def __init__(self, device):
            # A negative index means "leave the current device alone", as in torch.
            self.idx = -1 if isinstance(device, int) and device < 0 else index_of(device)
            self._scope = None

        def __enter__(self):
            self._scope = contextlib.nullcontext() if self.idx < 0 or on_cpu else device_module.device(self.idx)
            self._scope.__enter__()
            return self

        def __exit__(self, *exc_info):
            return self._scope.__exit__(*exc_info)

    class device_of(device):
        """The device of a tensor on the target; a no-op for any other tensor, as torch's is for
        tensors that are not CUDA's."""

        def __init__(self, obj):
            super().__init__(obj.get_device() if obj.device.type == device_type else -1)

    def get_device_name(device=None):
        return target.get_device_info(index_of(device)).name

    def get_device_capability(device=None):
        # A compute capability exists only for NVIDIA targets ("sm_90" -> (9, 0)); other targets
        # report (0, 0): no CUDA architecture.
        return cuda_capability(target.get_device_info(index_of(device)).architecture) or (0, 0)

    def get_device_properties(device=None):
        info = target.get_device_info(index_of(device))
        major, minor = get_device_capability(device)
        # A multiprocessor count the target does not report (emu) stays None, as in DeviceInfo: a 0
        # was a false claim that CUDA code divided by (ZeroDivisionError) or sized worker pools and
        # grids with (silently none); None fails at the first use that needs a number.
        return types.SimpleNamespace(name=info.name, total_memory=info.total_memory_bytes or 0,
                                     multi_processor_count=info.multiprocessor_count,
                                     major=major, minor=minor, is_integrated=info.features.unified_memory)

    def synchronize(device=None):
        target.synchronize(index_of(device))

    # -- memory: the target's real numbers ------------------------------------------------------------
    def stats(device=None):
        return target.get_memory_stats(index_of(device))

    def memory_allocated(device=None):
        return torch.accelerator.memory_allocated(index_of(device)) if not on_cpu else stats()["allocated_bytes"]

    def max_memory_allocated(device=None):
        return torch.accelerator.max_memory_allocated(index_of(device)) if not on_cpu else stats()["peak_allocated_bytes"]

    # The CPU keeps no cache: its "reserved" memory is what the process holds, i.e. its RSS.
    def memory_reserved(device=None):
        return torch.accelerator.memory_reserved(index_of(device)) if not on_cpu else stats()["allocated_bytes"]

    def max_memory_reserved(device=None):
        return torch.accelerator.max_memory_reserved(index_of(device)) if not on_cpu else stats()["peak_allocated_bytes"]

    def memory_stats(device=None):
        if not on_cpu:
            return torch.accelerator.memory_stats(index_of(device))
        s = stats()
        return {"allocated_bytes.all.current": s["allocated_bytes"], "allocated_bytes.all.peak": s["peak_allocated_bytes"],
                "reserved_bytes.all.current": s["allocated_bytes"], "reserved_bytes.all.peak": s["peak_allocated_bytes"]}

    def reset_peak_memory_stats(device=None):
        target.reset_peak_memory_stats(index_of(device))

    def empty_cache():
        target.empty_cache()

    def mem_get_info(device=None):
        s = stats(device)
        return s["free_bytes"], s["total_bytes"]

    def memory_stats_as_nested_dict(device=None):
        nested = {}
        for key, value in memory_stats(device).items():
            *path, leaf = key.split(".")
            node = nested
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = value
        return nested

    def reset_accumulated_memory_stats(device=None):
        # The CPU target reports current and peak figures only: it accumulates nothing to reset.
        if not on_cpu:
            torch.accelerator.reset_accumulated_memory_stats(index_of(device))

    def memory_summary(device=None, abbreviated=False):
        index = index_of(device)
        if "allocated_bytes.all.allocated" in memory_stats(index):
            # A caching allocator with torch's statistics (an SDK device's): torch's own table,
            # which reads them through torch.cuda.memory.memory_stats, replaced by the target's.
            return original_memory_summary(index, abbreviated)
        s = stats(index)  # the CPU: no caching allocator, so no table of pools and segments
        return (f"TorchBridge memory summary, target '{redirector.target}' device {index}: "
                f"{s['allocated_bytes']} bytes in use (process resident set), peak {s['peak_allocated_bytes']}; "
                f"{s['free_bytes']} of {s['total_bytes']} bytes free")

    # -- random numbers -----------------------------------------------------------------------------
    def manual_seed(seed):
        (torch.default_generator if on_cpu else device_module).manual_seed(seed)

    def manual_seed_all(seed):
        torch.default_generator.manual_seed(seed) if on_cpu else device_module.manual_seed_all(seed)

    def get_rng_state(device="cuda"):
        return torch.get_rng_state() if on_cpu else device_module.get_rng_state(index_of(device))

    def set_rng_state(new_state, device="cuda"):  # torch.cuda's parameter names: callers pass them by keyword
        torch.set_rng_state(new_state) if on_cpu else device_module.set_rng_state(new_state, index_of(device))

    # -- streams and events ---------------------------------------------------------------------------
    def make_stream(device=None, priority=0, **kwargs):
        if on_cpu:
            index_of(device)  # a device the target does not have is refused here as elsewhere
            return HostStream()
        return TargetStream(torch.device(device_type, index_of(device)), priority=priority)

    def make_event(enable_timing=False, blocking=False, interprocess=False):
        if on_cpu:
            return HostEvent(enable_timing=enable_timing)
        # A plain torch.Event: its elapsed_time takes only an exact torch.Event as the end event,
        # so a subclass answering torch.cuda.Event's keywords could not be timed against.
        return torch.Event(torch.device(device_type, index_of()), enable_timing=enable_timing)

    def current_stream(device=None):
        return current_host_stream() if on_cpu else as_target_stream(torch.accelerator.current_stream(index_of(device)))

    def default_stream(device=None):
        if on_cpu:
            return DEFAULT_HOST_STREAM
        index = index_of(device)
        # torch.Stream takes the device type as c10's number, which a stream of the target knows.
        return TargetStream(stream_id=0, device_index=index,
                            device_type=torch.accelerator.current_stream(index).device_type)

    @contextlib.contextmanager
    def stream(stream):  # torch.cuda.stream's parameter name: timm passes it by keyword
        if stream is None:
            yield
            return
        with stream:
            yield

    def is_bf16_supported(including_emulation=True):
        return computes("bf16", target.name, index_of(None), including_emulation)

    # -- random numbers on every device, and the rest of torch.cuda.random --------------------------------
    def get_rng_state_all():
        return [torch.get_rng_state()] if on_cpu else device_module.get_rng_state_all()

    def set_rng_state_all(new_states):
        if not on_cpu:
            return device_module.set_rng_state_all(new_states)
        states = list(new_states)
        if len(states) != 1:
            raise ValueError(f"set_rng_state_all: the target 'cpu' has one generator, got {len(states)} states")
        torch.set_rng_state(states[0])

    def seed():
        (torch if on_cpu else device_module).seed()

    def seed_all():
        torch.seed() if on_cpu else device_module.seed_all()

    def initial_seed():
        return (torch if on_cpu else device_module).initial_seed()

    def set_stream(stream):
        if stream is None:
            return
        if on_cpu:
            set_current_host_stream(stream)
        else:
            torch.accelerator.set_stream(stream)

    # isinstance(s, torch.cuda.Stream) holds for every stream of the target, as it held for every
    # torch.Stream before TargetStream (torch's own code hands out plain ones); the streams made
    # through torch.cuda answer priority too.
    stream_type, event_type = (HostStream, HostEvent) if on_cpu else (torch.Stream, torch.Event)
    stream_class = HostStream if on_cpu else TargetStream
    cuda = {
        "is_available": lambda: True, "device_count": device_count, "current_device": current_device,
        "set_device": set_device, "device": device, "get_device_name": get_device_name,
        "get_device_capability": get_device_capability, "get_device_properties": get_device_properties,
        "synchronize": synchronize, "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated, "memory_reserved": memory_reserved,
        "max_memory_reserved": max_memory_reserved, "memory_stats": memory_stats,
        "reset_peak_memory_stats": reset_peak_memory_stats, "empty_cache": empty_cache,
        "mem_get_info": mem_get_info, "manual_seed": manual_seed, "manual_seed_all": manual_seed_all,
        "get_rng_state": get_rng_state, "set_rng_state": set_rng_state,
        "Stream": proxy_class(stream_type, make_stream, "Stream", {"priority_range": stream_class.priority_range}),
        "Event": proxy_class(event_type, make_event, "Event"),
        "current_stream": current_stream, "default_stream": default_stream,
        "stream": stream, "is_bf16_supported": is_bf16_supported, "is_initialized": lambda: True,
        "init": lambda: None, "device_of": device_of, "memory_summary": memory_summary,
        "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
        "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
        "get_rng_state_all": get_rng_state_all, "set_rng_state_all": set_rng_state_all, "seed": seed,
        "seed_all": seed_all, "initial_seed": initial_seed, "set_stream": set_stream,
    }
    if device_type != "cuda":
        cuda.update(_cuda_unavailable.replacements(redirector.target))
        # SDK devices' caching allocator and XPU's take CUDA's per-process cap, with its arguments
        # (MPS's has another meaning: a share of its recommended limit, up to 2).
        if hasattr(device_module, "get_per_process_memory_fraction"):
            cuda["set_per_process_memory_fraction"] = lambda fraction, device=None: \
                device_module.set_per_process_memory_fraction(fraction, index_of(device))
            cuda["get_per_process_memory_fraction"] = lambda device=None: \
                device_module.get_per_process_memory_fraction(index_of(device))
        # Nothing is shared through CUDA's interprocess handles, so there is nothing to collect.
        cuda["ipc_collect"] = lambda: None
        # TF32 is the float32 mode of NVIDIA's tensor cores; the target computes float32 as float32.
        cuda["is_tf32_supported"] = lambda: False
        # torch.compile asks this whenever torch.cuda.is_available() (answered True above); the real
        # function needs a CUDA driver. The target captures no CUDA graphs.
        cuda["is_current_stream_capturing"] = lambda: False
    return cuda, device_type


def nvtx_replacements():
    """NVTX ranges become profiler ranges (torch.profiler.record_function), which every backend has."""
    open_ranges = []  # range_push/range_pop: a stack
    started = {}  # range_start/range_end: by id, in any order
    next_id = itertools.count(1)

    # torch.cuda.nvtx's parameter names (msg, range_id), which callers may pass by keyword.
    def range_push(msg):
        scope = torch.profiler.record_function(msg)
        scope.__enter__()
        open_ranges.append(scope)
        return len(open_ranges) - 1

    def range_pop():
        if open_ranges:
            open_ranges.pop().__exit__(None, None, None)
        return len(open_ranges)

    def range_start(msg):
        scope = torch.profiler.record_function(msg)
        scope.__enter__()
        range_id = next(next_id)
        started[range_id] = scope
        return range_id

    def range_end(range_id):
        scope = started.pop(range_id, None)
        if scope is None:
            raise ValueError(f"torch.cuda.nvtx.range_end: no range {range_id!r} was started by range_start (or it "
                             "has ended)")
        scope.__exit__(None, None, None)

    def mark(msg):
        with torch.profiler.record_function(msg):
            pass

    @contextlib.contextmanager
    def range(msg, *args, **kwargs):
        with torch.profiler.record_function(msg.format(*args, **kwargs)):
            yield

    return {"range_push": range_push, "range_pop": range_pop, "range_start": range_start, "range_end": range_end,
            "mark": mark, "range": range}
