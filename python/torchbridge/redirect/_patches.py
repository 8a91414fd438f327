"""Installs redirection into torch: device construction, factories, movement, generators,
serialization, autocast/GradScaler and the torch.cuda namespace. Every replacement goes through
the Patcher so it can be undone exactly."""

import functools
import importlib
import inspect

import torch
import torch.nn
import torch.utils._device

from . import (_attention, _autocast_queries, _cuda, _cuda_unavailable, _distributed, _legacy_types, _lightning,
               _multiprocessing, _optim, _parallel, _profiler, _serialization)
from ._host import HostStream
from ._proxy import StandIn, proxy_class
from ._redirector import is_device_like, logger

# Tensor factories and *_like functions that take a device= argument.
FACTORIES = (
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm",
    "arange", "range", "linspace", "logspace", "eye", "empty_strided", "scalar_tensor", "tril_indices",
    "triu_indices", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
    "randint_like", "normal", "bernoulli", "poisson", "from_file", "asarray", "empty_permuted",
    "sparse_coo_tensor", "sparse_csr_tensor", "sparse_csc_tensor", "sparse_bsr_tensor", "sparse_bsc_tensor",
    "sparse_compressed_tensor", "hann_window", "hamming_window", "bartlett_window", "blackman_window",
    "kaiser_window",
)
# Factories outside torch's own namespace, as (submodule of torch, names).
SUBMODULE_FACTORIES = (("fft", ("fftfreq", "rfftfreq")), ("nested", ("nested_tensor", "as_nested_tensor")))
TENSOR_NEW = ("new_tensor", "new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided")


def _with_device_kwarg(function, redirector, host_only, pin_for_the_target):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if kwargs.get("device") is not None:
            kwargs["device"] = redirector.resolve(kwargs["device"])
        if host_only and kwargs.get("pin_memory"):
            _note_pinning_is_moot()
            kwargs["pin_memory"] = False
        elif pin_for_the_target and kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
            return function(*args, **kwargs).pin_memory()  # the accelerator's pinned allocator: the target's
        return function(*args, **kwargs)

    return wrapper


def torch_pins_for_cuda_instead_of(target: str) -> bool:
    """Whether torch's pin_memory=True would pin for CUDA rather than for `target`: ATen takes CUDA's
    pinned allocator whenever the machine has CUDA, even when an SDK device is the process's
    accelerator, and an SDK device copies CUDA's pinned memory synchronously (include/torchbridge/pinned_host.h).
    Tensor.pin_memory() pins for the accelerator, the target. The device count does not create a
    CUDA context."""
    count = getattr(torch._C, "_cuda_getDeviceCount", None)
    return target not in ("cpu", "cuda") and count is not None and count() > 0


_pinning_noted = []


def _note_pinning_is_moot():
    # Page-locking only speeds host->device DMA; with the CPU as the target nothing is transferred.
    if not _pinning_noted:
        _pinning_noted.append(True)
        logger.info("pin_memory has no effect when redirecting to the CPU: there is no device transfer to speed up")


def _is_cpu_override(args, kwargs) -> bool:
    """torch.device("cpu:-1"), torch.device("cpu", -1) or torch.device(type="cpu", index=-1)."""
    if len(args) == 1 and not kwargs and isinstance(args[0], str):
        return args[0].strip() == "cpu:-1"
    spec = dict(zip(("type", "index"), args), **kwargs)
    return spec.get("type") == "cpu" and isinstance(spec.get("index"), int) and spec["index"] == -1


def _with_device_argument(method, redirector):
    """A Tensor method whose one optional argument is a device (pin_memory, is_pinned)."""

    @functools.wraps(method)
    def with_device_argument(self, device=None):
        if device is None:
            return method(self)
        return method(self, redirector.resolve(device) if is_device_like(device) else device)

    return with_device_argument


def _fork_only_the_cpu_rng(patcher, original_device):
    """torch.random.fork_rng for a device (cuda by default) when the CPU is the target.

    There the device's generator is the CPU's, which fork_rng always forks. torch 2.13 finds the
    device's module through torch.get_device_module (replaced below in install), but torch 2.11
    and 2.12 take getattr(torch, torch.device(device_type).type): "cuda" resolves to "cpu", and
    torch.cpu has no generator functions (fork_rng(devices=[0]) raised AttributeError on the
    H200 run, torch 2.11). Asking for no device of the type "cpu" forks the same state in both."""
    original_fork_rng = torch.random.fork_rng
    signature = inspect.signature(original_fork_rng)

    @functools.wraps(original_fork_rng)
    def fork_rng(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        device_type = call.arguments["device_type"]
        if device_type is None or original_device(device_type).type not in ("cpu", "meta"):
            call.arguments.update(devices=[], device_type="cpu")
        return original_fork_rng(*call.args, **call.kwargs)

    patcher.replace(torch.random, "fork_rng", fork_rng)


def _rebuild_grad_scaler(state):
    """A pickled redirected GradScaler, as torch.amp.GradScaler is in this process: the redirected
    one while redirection is on, torch's own otherwise. The state is torch's (its __getstate__),
    so its device type is the one the scaler had: the redirection target's (e.g. "emu"), which the
    unpickling process must have too."""
    scaler = torch.amp.GradScaler.__new__(torch.amp.GradScaler)
    scaler.__setstate__(state)
    return scaler


def install(redirector, patcher):
    original_device = torch.device
    original_generator = torch.Generator
    resolve = redirector.resolve

    # -- torch.device("cuda:1") and torch.Generator(device=...) -----------------------------------
    def make_device(*args, **kwargs):
        if _is_cpu_override(args, kwargs):  # torch itself refuses a negative index
            redirector.cpu_device_requested()
            return original_device("cpu")
        if len(args) == 1 and not kwargs and isinstance(args[0], int) and not isinstance(args[0], bool):
            # torch.device(0) names the current accelerator's device 0 (torch refuses it with none,
            # as on the CPU target); programs mean CUDA's (accelerate's device maps are such ints).
            return resolve(args[0])
        return resolve(original_device(*args, **kwargs))

    def make_generator(device="cpu", **kwargs):
        return original_generator(device=resolve(device), **kwargs)

    patcher.replace(torch, "device", proxy_class(original_device, make_device))
    patcher.replace(torch, "Generator", proxy_class(original_generator, make_generator))

    # -- factories --------------------------------------------------------------------------------
    # torch.set_default_device / `with torch.device(...)` fill in device= for the factories in a
    # set that torch computes once (lru_cache) and compares with the function being called. Were
    # it first computed after the wrappers below replace torch.zeros & co., it would hold the
    # wrappers, torch would call the originals, and every tensor would land on the CPU silently.
    torch.utils._device._device_constructors()
    host_only = redirector.target == "cpu"
    pin_for_the_target = torch_pins_for_cuda_instead_of(redirector.target)
    for name in FACTORIES:
        if hasattr(torch, name):
            patcher.replace(torch, name,
                            _with_device_kwarg(getattr(torch, name), redirector, host_only, pin_for_the_target))
    for submodule_name, names in SUBMODULE_FACTORIES:
        submodule = getattr(torch, submodule_name)
        for name in names:
            patcher.replace(submodule, name,
                            _with_device_kwarg(getattr(submodule, name), redirector, host_only, pin_for_the_target))
    for name in TENSOR_NEW:
        patcher.replace(torch.Tensor, name,
                        _with_device_kwarg(getattr(torch.Tensor, name), redirector, host_only, pin_for_the_target))
    if host_only:
        def pin_memory(self, device=None):
            _note_pinning_is_moot()
            return self

        patcher.replace(torch.Tensor, "pin_memory", pin_memory)
        original_record_stream = torch.Tensor.record_stream

        @functools.wraps(original_record_stream)
        def record_stream(self, stream):
            if isinstance(stream, HostStream):
                return None  # CPU work is finished when it returns: no later use to record
            return original_record_stream(self, stream)

        patcher.replace(torch.Tensor, "record_stream", record_stream)
        original_loader_init = torch.utils.data.DataLoader.__init__

        @functools.wraps(original_loader_init)
        def loader_init(self, *args, **kwargs):
            # DataLoader warned "'pin_memory' argument is set as true but no accelerator is found" on
            # every loader of a program written for a GPU (Trainer's, timm's): pinning is moot here.
            if kwargs.get("pin_memory"):
                _note_pinning_is_moot()
                kwargs["pin_memory"] = False
            return original_loader_init(self, *args, **kwargs)

        patcher.replace(torch.utils.data.DataLoader, "__init__", loader_init)
        # With the CPU as the target no accelerator is in use, whatever torch was built for. A CUDA
        # build of torch would otherwise name cuda here, and torch.accelerator.is_available() asks
        # torch.cuda.is_available(), which answers True for the program's sake: DataLoader would
        # then pin memory through a CUDA that may have no driver.
        patcher.replace(torch.accelerator, "current_accelerator", lambda check_available=False: None)
        patcher.replace(torch.accelerator, "is_available", lambda: False)
        _optim.install(patcher)
    else:
        # The deprecated device argument of pin_memory/is_pinned names the accelerator whose copies
        # the pinning serves; torch.device("cuda") already means the target, a "cuda" string did not
        # (pin_memory("cuda") initialised CUDA and failed).
        for name in ("pin_memory", "is_pinned"):
            patcher.replace(torch.Tensor, name, _with_device_argument(getattr(torch.Tensor, name), redirector))

    # -- torch.get_device_module("cuda") -------------------------------------------------------------
    # torch asks for "the module of device X" (fork_rng, checkpointing's RNG state), which resolves
    # X through torch.device. With the CPU as the target that is torch.cpu, which has no generators
    # (fork_rng(devices=[0]) raised AttributeError); the torch.cuda namespace answers them for the
    # CPU. The uncached function is called: torch's cache would keep redirected answers after
    # disable(), and answers from before enable() during it.
    find_device_module = torch.get_device_module.__wrapped__

    def get_device_module(device=None):
        module = find_device_module(device)
        if module is torch.cpu and device is not None and original_device(device).type != "cpu":
            return torch.cuda
        return module

    # torch.compile reads torch.get_device_module.__wrapped__ to find the function it traces
    # specially; this replacement leads it to the same one.
    get_device_module.__wrapped__ = find_device_module
    patcher.replace(torch, "get_device_module", get_device_module)
    if host_only:
        _fork_only_the_cpu_rng(patcher, original_device)

    # -- storages made directly: torch.UntypedStorage(n, device="cuda") ---------------------------------
    # Their constructors are torch's C StorageBase.__new__ (UntypedStorage inherits it) and
    # TypedStorage's own; each gets the device resolved. Removing the replacement restores the
    # inherited one.
    for storage_class in (torch.UntypedStorage, torch.TypedStorage):
        original_new = storage_class.__new__

        def new(cls, *args, original_new=original_new, **kwargs):
            if kwargs.get("device") is not None:
                kwargs["device"] = resolve(kwargs["device"])
            return original_new(cls, *args, **kwargs)

        patcher.replace(storage_class, "__new__", staticmethod(new))

    # -- moving tensors and modules ---------------------------------------------------------------
    tensor_to, module_to = torch.Tensor.to, torch.nn.Module.to

    def redirect_to_args(args, kwargs):
        if args and is_device_like(args[0]):
            args = (resolve(args[0]),) + tuple(args[1:])
        if kwargs.get("device") is not None:
            kwargs["device"] = resolve(kwargs["device"])
        return args, kwargs

    @functools.wraps(tensor_to)
    def tensor_to_redirected(self, *args, **kwargs):
        args, kwargs = redirect_to_args(args, kwargs)
        return tensor_to(self, *args, **kwargs)

    def tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        target = resolve("cuda" if device is None else (f"cuda:{device}" if isinstance(device, int) else device))
        return tensor_to(self, target, non_blocking=non_blocking, memory_format=memory_format)

    @functools.wraps(module_to)
    def module_to_redirected(self, *args, **kwargs):
        args, kwargs = redirect_to_args(args, kwargs)
        return module_to(self, *args, **kwargs)

    def module_cuda(self, device=None):
        return module_to(self, resolve("cuda" if device is None else
                                       (f"cuda:{device}" if isinstance(device, int) else device)))

    patcher.replace(torch.Tensor, "to", tensor_to_redirected)
    patcher.replace(torch.Tensor, "cuda", tensor_cuda)
    patcher.replace(torch.nn.Module, "to", module_to_redirected)
    patcher.replace(torch.nn.Module, "cuda", module_cuda)

    # -- torch.load(map_location=...) ---------------------------------------------------------------
    _serialization.install(patcher, redirector)

    # -- autocast and GradScaler for "cuda" -----------------------------------------------------------
    cuda_namespace, target_type = _cuda.build(redirector)
    original_autocast, original_scaler = torch.autocast, torch.amp.GradScaler

    def device_type_of(requested):
        return resolve(requested).type

    # With the CPU as the target, CUDA's autocast dtype is kept apart from the CPU's (float16, not
    # bfloat16), and a region opened for "cuda" without a dtype starts with it; other targets' autocast
    # state stands for CUDA's as it is.
    cuda_dtype_apart = target_type != "cuda" and _autocast_queries.install(patcher, target_type)

    def autocast_dtype_of(requested, dtype):
        """CUDA's dtype for a region opened for "cuda" without one where it is kept apart (the CPU
        target: float16, not the CPU's default); else what torch.autocast takes."""
        names_cuda = isinstance(requested, str) and requested.strip().split(":")[0] == "cuda"
        if dtype is None and cuda_dtype_apart and names_cuda:
            return torch.get_autocast_dtype("cuda")
        return dtype

    # The replacements stand in for torch's classes in isinstance checks (StandIn), and torch.cuda.amp's
    # derive from them, as torch's derive from torch.amp's: a torch.cuda.amp.GradScaler() is a
    # torch.amp.GradScaler, which checkpoint.save_training_state requires. autocast's __init__ is one
    # call, as torch.compile traces it: a graph break before torch's __init__ ran, with more code after
    # it, left dynamo an autocast without attributes (AttributeError: no attribute 'device').
    class autocast(original_autocast, metaclass=StandIn):
        def __init__(self, device_type="cuda", dtype=None, *args, **kwargs):
            super().__init__(device_type_of(device_type), autocast_dtype_of(device_type, dtype), *args, **kwargs)

    class GradScaler(original_scaler, metaclass=StandIn):
        def __init__(self, device="cuda", *args, **kwargs):
            super().__init__(device_type_of(device), *args, **kwargs)

        def __reduce_ex__(self, protocol):
            # This class and torch.cuda.amp's below live inside install(), where pickle cannot find
            # them by name: their scalers are pickled (multiprocessing, torch.save of a training
            # script's objects) as whatever torch.amp.GradScaler is where they are unpickled, with
            # torch's own state. A program's own subclass is found by its name, as usual.
            if type(self) not in (GradScaler, cuda_amp_GradScaler):
                return super().__reduce_ex__(protocol)
            return _rebuild_grad_scaler, (self.__getstate__(),)

    class cuda_amp_autocast(autocast):
        def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
            super().__init__(target_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    class cuda_amp_GradScaler(GradScaler):
        def __init__(self, *args, **kwargs):
            super().__init__(target_type, *args, **kwargs)

    # Custom autograd functions decorated for CUDA autocast cast their inputs when autocast for
    # "cuda" is on; under redirection the autocast that is on is the target's.
    original_custom_fwd, original_custom_bwd = torch.amp.custom_fwd, torch.amp.custom_bwd

    def custom_fwd(fwd=None, *, device_type, cast_inputs=None):
        return original_custom_fwd(fwd, device_type=device_type_of(device_type), cast_inputs=cast_inputs)

    def custom_bwd(bwd=None, *, device_type):
        return original_custom_bwd(bwd, device_type=device_type_of(device_type))

    def cuda_amp_custom_fwd(fwd=None, *, cast_inputs=None):
        return original_custom_fwd(fwd, device_type=target_type, cast_inputs=cast_inputs)

    def cuda_amp_custom_bwd(bwd):
        return original_custom_bwd(bwd, device_type=target_type)

    patcher.replace(torch.amp, "custom_fwd", custom_fwd)
    patcher.replace(torch.amp, "custom_bwd", custom_bwd)
    patcher.replace(torch.cuda.amp, "custom_fwd", cuda_amp_custom_fwd)
    patcher.replace(torch.cuda.amp, "custom_bwd", cuda_amp_custom_bwd)
    patcher.replace(torch, "autocast", autocast)
    patcher.replace(torch.amp, "autocast", autocast)
    patcher.replace(torch.amp, "GradScaler", GradScaler)
    patcher.replace(torch.cuda.amp, "autocast", cuda_amp_autocast)
    patcher.replace(torch.cuda.amp, "GradScaler", cuda_amp_GradScaler)

    # -- torch.compile ------------------------------------------------------------------------------------
    # Inductor has no code generator for SDK devices, and for other targets it probes torch.cuda,
    # which redirection answers for the target; so compiled code runs through aot_eager (the same
    # graph capture and autograd, without generated kernels), and says so once.
    if target_type != "cuda":
        reason = (f"inductor generates no code for device '{target_type}'"
                  if target_type not in ("cpu", "xpu", "mps")
                  else "inductor probes torch.cuda, which redirection answers for the target")
        original_compile = torch.compile
        warned = []

        @functools.wraps(original_compile)
        def compile(model=None, *args, backend="inductor", **kwargs):
            if backend == "inductor":
                if not warned:
                    warned.append(True)
                    logger.warning("torch.compile: %s; compiling with the 'aot_eager' backend instead", reason)
                backend = "aot_eager"
            return original_compile(model, *args, backend=backend, **kwargs)

        patcher.replace(torch, "compile", compile)

    # -- the torch.cuda namespace -----------------------------------------------------------------------
    # torch.cuda re-exports the functions of its submodules, which call each other there (memory_summary
    # reads memory_stats, the random functions read device_count) and which code also calls there
    # (torch.cuda.memory.set_per_process_memory_fraction): each is replaced where it is the same object.
    submodules = [importlib.import_module(f"torch.cuda.{module}") for module in ("graphs", "memory", "random")]
    for name, replacement in cuda_namespace.items():
        for submodule in submodules:
            if getattr(submodule, name, submodule) is getattr(torch.cuda, name, None):
                patcher.replace(submodule, name, replacement)
        patcher.replace(torch.cuda, name, replacement)
    if target_type != "cuda":  # CUDA's own NVTX ranges and NCCL work where CUDA is the target
        for name, replacement in _cuda.nvtx_replacements().items():
            patcher.replace(torch.cuda.nvtx, name, replacement)
        nccl = importlib.import_module("torch.cuda.nccl")
        for name, replacement in _cuda_unavailable.nccl_replacements(redirector.target).items():
            patcher.replace(nccl, name, replacement)
        for name, replacement in _cuda_unavailable.memory_history_replacements(redirector.target).items():
            patcher.replace(torch.cuda.memory, name, replacement)
        for (module, name), replacement in _cuda_unavailable.submodule_replacements(redirector.target).items():
            patcher.replace(importlib.import_module(f"torch.cuda.{module}"), name, replacement)

    # -- child processes started by multiprocessing redirect as this one does ---------------------------
    _multiprocessing.install(patcher, redirector)

    # -- what torch builds without CUDA lack: DataParallel's collectives, the legacy typed tensors ----
    if target_type != "cuda":
        _parallel.install(patcher, redirector, target_type)
        _legacy_types.install(patcher, original_device(target_type))
        _distributed.install(patcher, redirector, target_type)
        if target_type == "cpu":
            _attention.install(patcher)
        _lightning.install(patcher, target_type)
        _lightning.install_launchers(patcher, redirector.target, redirector.explicit)
        _profiler.install(patcher, target_type)
