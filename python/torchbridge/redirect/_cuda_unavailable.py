"""torch.cuda functions with no counterpart on a target other than CUDA. Left alone, each of them
fails obscurely (AttributeError on a torch._C._cuda_* binding, "nvidia-ml-py not installed") or,
worse, does nothing and answers as if it had worked (caching_allocator_enable, host_memory_stats
before CUDA's initialisation). Under redirection each raises a RuntimeError that names the
function, the target and why; CUDA graphs are classes, as code names them in annotations."""

import torch

_NVML = "it reads NVIDIA's management library (NVML) about a CUDA GPU; the target has no such counters"
_ALLOCATOR = "it controls or inspects CUDA's caching allocator, which the target does not use"
_HOST_ALLOCATOR = "it reports CUDA's pinned host memory allocator, which the target does not use"
_GRAPHS = "a CUDA graph replays recorded CUDA kernels, and the target runs none; run the captured code directly"

# torch.cuda name -> why it cannot run on the target.
REASONS = {
    **dict.fromkeys(("utilization", "temperature", "power_draw", "clock_rate", "memory_usage",
                     "device_memory_used", "list_gpu_processes"), _NVML),
    **dict.fromkeys(("get_allocator_backend", "memory_snapshot", "caching_allocator_alloc",
                     "caching_allocator_delete", "caching_allocator_enable", "caching_allocator_disabled",
                     "get_per_process_memory_fraction", "set_per_process_memory_fraction",
                     "change_current_allocator"), _ALLOCATOR),
    **dict.fromkeys(("host_memory_stats", "host_memory_stats_as_nested_dict", "reset_peak_host_memory_stats",
                     "reset_accumulated_host_memory_stats"), _HOST_ALLOCATOR),
    "current_blas_handle": "it returns a cuBLAS handle, which exists for CUDA devices only",
    "current_solver_handle": "it returns a cuSOLVER handle, which exists for CUDA devices only",
    "get_sync_debug_mode": "CUDA's synchronisation debug mode watches CUDA streams only",
    "set_sync_debug_mode": "CUDA's synchronisation debug mode watches CUDA streams only",
    "can_device_access_peer": "it asks the CUDA driver about peer access between two GPUs",
    "cudart": "it returns the CUDA runtime library, which the target does not run on",
    "check_error": "it interprets CUDA runtime error codes",
    "get_stream_from_external": "it wraps a stream that the CUDA runtime made outside torch",
    "graph_pool_handle": _GRAPHS,
    "make_graphed_callables": _GRAPHS,
}
GRAPH_CLASSES = ("CUDAGraph", "graph")
# Classes whose construction has no counterpart: torch.cuda name -> why.
CLASSES = {**dict.fromkeys(GRAPH_CLASSES, _GRAPHS),
           "ExternalStream": "it wraps a stream that the CUDA runtime made outside torch"}

# torch.cuda.memory's memory history (the allocator's record of every allocation with its stack,
# read by the memory snapshot tools), private by name but widely called.
_HISTORY = "the memory history is recorded by CUDA's caching allocator, which the target does not use"
MEMORY_HISTORY_FUNCTIONS = ("_record_memory_history", "_snapshot", "_dump_snapshot")


# torch.cuda.nccl's functions call NCCL directly. is_available stays: it answers False truthfully.
NCCL_FUNCTIONS = ("version", "unique_id", "init_rank", "all_reduce", "reduce", "broadcast", "all_gather",
                  "reduce_scatter")
_NCCL = ("NCCL runs collectives between CUDA GPUs only; torch.distributed's init_process_group(\"nccl\") "
         "runs on Gloo when the target is the CPU")


# torch.cuda's submodules whose functions call CUDA-only bindings (a CPU build of torch raised a bare
# AttributeError on torch._C._cuda_tunableop_*, or on None for the profiler's cudart).
_TUNABLE = "TunableOp tunes CUDA and ROCm GEMM kernels, and the target runs none"
# What TunableOp answers truthfully on the target: nothing is enabled, nothing records.
TUNABLE_QUERIES = ("is_enabled", "tuning_is_enabled", "record_untuned_is_enabled")
_PROFILER = "it starts or stops NVIDIA's CUDA profiler (cudaProfilerStart/Stop), which sees no work on the target"
PROFILER_FUNCTIONS = ("start", "stop", "profile")  # its cudart and check_error are torch.cuda's, refused above


def _refusal(qualified_name, reason, target):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"torch.cuda.{qualified_name} cannot run under redirection to '{target}': {reason}")

    refuse.__name__ = qualified_name.rsplit(".", 1)[-1]
    return refuse


def replacements(target: str) -> dict:
    """{torch.cuda name: replacement} for the names above that this torch has."""
    result = {name: _refusal(name, reason, target) for name, reason in REASONS.items() if hasattr(torch.cuda, name)}
    for name, reason in CLASSES.items():
        result[name] = type(name, (), {"__init__": _refusal(name, reason, target), "__module__": "torch.cuda"})
    return result


def memory_history_replacements(target: str) -> dict:
    """{torch.cuda.memory name: replacement}: a CPU build of torch fails on a missing torch._C
    binding (AttributeError), a CUDA build would record CUDA's allocator, not the target's."""
    import torch.cuda.memory as memory

    result = {name: _refusal(f"memory.{name}", _HISTORY, target) for name in MEMORY_HISTORY_FUNCTIONS
              if hasattr(memory, name)}
    if "_record_memory_history" in result:
        refuse = result["_record_memory_history"]

        def record_memory_history(enabled="all", *args, **kwargs):
            # Stopping a recording (enabled=None, as cleanup code does) stops nothing: none was started.
            if enabled is None:
                return None
            return refuse(enabled, *args, **kwargs)

        result["_record_memory_history"] = record_memory_history
    return result


def submodule_replacements(target: str) -> dict:
    """{(torch.cuda submodule, name): replacement} for torch.cuda.tunable and torch.cuda.profiler."""
    import torch.cuda.profiler as profiler
    import torch.cuda.tunable as tunable

    result = {("profiler", name): _refusal(f"profiler.{name}", _PROFILER, target) for name in PROFILER_FUNCTIONS
              if hasattr(profiler, name)}
    for name in tunable.__all__:
        result[("tunable", name)] = ((lambda: False) if name in TUNABLE_QUERIES
                                     else _refusal(f"tunable.{name}", _TUNABLE, target))
    return result


def nccl_replacements(target: str) -> dict:
    """{torch.cuda.nccl name: replacement}. Without them a CPU build of torch fails with an
    AttributeError on torch._C._nccl_version, and a CUDA build would hand NCCL the target's tensors."""
    import torch.cuda.nccl as nccl

    return {name: _refusal(f"nccl.{name}", _NCCL, target) for name in NCCL_FUNCTIONS if hasattr(nccl, name)}
