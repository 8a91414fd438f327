"""torch.distributed.init_process_group("nccl") (and new_group, new_subgroups...) under redirection
to a target other than CUDA.
NCCL reduces CUDA tensors only. With the CPU as the target, every tensor the program hands to a
collective is a CPU tensor, so Gloo (every build of torch has it) takes NCCL's place, logged once.
An SDK device's tensors have no collective backend in torch.distributed (Gloo takes CPU tensors
only), so that is an error naming the way out rather than a failure at the first collective."""

import functools
import inspect

import torch

from ._redirector import logger

# What a program that asked for collectives on an SDK device is told to do instead.
_SDK_WAY_OUT = ("For data-parallel training on an SDK device use torchbridge.distributed.DataParallel; or run "
                "this program with TORCHBRIDGE_BACKEND=cpu (Gloo)")


def _backends_by_device(backend) -> "dict[str, str] | None":
    """"nccl" -> {"cuda": "nccl"}; "cpu:gloo,cuda:nccl" -> {"cpu": "gloo", "cuda": "nccl"}; None for
    anything else (torch judges it)."""
    if not isinstance(backend, str):
        return None
    if ":" not in backend:
        return {"cuda": "nccl"} if backend.strip().lower() == "nccl" else None
    pairs = [part.strip().lower().split(":", 1) for part in backend.split(",")]
    return dict(pairs) if all(len(pair) == 2 for pair in pairs) else None


def _redirected_backend(backend, call, redirector, device_type):
    """What to ask torch for in place of ``backend``: the same where it names no NCCL; on the CPU
    target Gloo in NCCL's place (logged); on an SDK device an error naming the way out."""
    mapping = _backends_by_device(backend)
    if mapping is None or "nccl" not in mapping.values():
        return backend
    if device_type != "cpu":
        raise RuntimeError(
            f"{call}(backend={backend!r}) under redirection to '{redirector.target}': NCCL reduces "
            f"CUDA tensors, and torch.distributed has no collective backend for '{device_type}' tensors (Gloo "
            f"takes CPU tensors). {_SDK_WAY_OUT}")
    mapping.pop("cuda", None)
    mapping.setdefault("cpu", "gloo")
    replacement = ",".join(f"{device}:{name}" for device, name in mapping.items()) if len(mapping) > 1 \
        else mapping["cpu"]
    logger.info("%s: backend %r -> %r (the target is the CPU, whose tensors Gloo reduces)", call, backend,
                replacement)
    return replacement


def _with_backend_redirected(original, redirector, device_type):
    """``original`` (init_process_group, new_group, new_subgroups...) with its ``backend`` argument,
    positional or keyword, redirected."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def with_backend_redirected(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # torch's own error for a wrong call
        backend = bound.arguments.get("backend")
        replacement = _redirected_backend(backend, original.__name__, redirector, device_type)
        if replacement is not backend:
            bound.arguments["backend"] = replacement
            device_id = bound.arguments.get("device_id")
            # device_id binds a process to its GPU for NCCL's eager set-up (a torch.device, or an int:
            # the index of the accelerator); the CPU has none to bind.
            if (isinstance(device_id, torch.device) and device_id.type == "cpu") or (
                    isinstance(device_id, int) and not isinstance(device_id, bool)):
                del bound.arguments["device_id"]
        return original(*bound.args, **bound.kwargs)

    return with_backend_redirected


def install(patcher, redirector, device_type):
    import torch.distributed as dist

    if not dist.is_available():
        return
    # The calls that name a backend. new_subgroups calls torch's own new_group, so each is wrapped.
    for name in ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration"):
        if hasattr(dist, name):
            patcher.replace(dist, name, _with_backend_redirected(getattr(dist, name), redirector, device_type))
    if device_type == "cpu":
        _keep_the_default_group_out_of_torchs_defaults()
        _patch_ddp_for_the_cpu(patcher, torch.nn.parallel.DistributedDataParallel)
    elif device_type != "cuda":
        _refuse_ddp_on_the_device(patcher, torch.nn.parallel.DistributedDataParallel, redirector, device_type)


def _keep_the_default_group_out_of_torchs_defaults():
    """torch.distributed.nn.functional's collectives take ``group=group.WORLD`` as a default argument,
    evaluated when the module is imported. DistributedDataParallel imports it (through
    torch.distributed._shard) after the program's init_process_group, so the defaults then hold the
    default group for the life of the interpreter: destroy_process_group() and the last DDP's end no
    longer end its Gloo workers. Alive at exit, a worker still dropping a finished collective's
    tensors needs the GIL during finalization and aborts the process (the torch race the README
    describes). Imported now, before any group exists, the defaults are None, which torch reads as
    the default group at each call: the same behaviour, and the group ends when the program lets
    go of it."""
    import torch.distributed.nn.functional  # noqa: F401  (imported for its side effect, above)


def _refuse_ddp_on_the_device(patcher, ddp, redirector, device_type):
    """A model on an SDK device under a Gloo group (what Lightning's DDP picks for a device that is
    not "cuda") failed in torch's constructor with "ProcessGroupGloo::allgather: unsupported device
    type", naming no way out; refused here as init_process_group("nccl") is."""
    original_init = ddp.__init__

    @functools.wraps(original_init)
    def __init__(self, module, *args, **kwargs):
        if any(p.device.type == device_type for p in module.parameters()):
            raise RuntimeError(
                f"DistributedDataParallel under redirection to '{redirector.target}': the model is on "
                f"'{device_type}', and torch.distributed has no collective backend for '{device_type}' tensors "
                f"(Gloo takes CPU tensors, NCCL CUDA ones). {_SDK_WAY_OUT}")
        original_init(self, module, *args, **kwargs)

    patcher.replace(ddp, "__init__", __init__)


def _patch_ddp_for_the_cpu(patcher, ddp):
    """DistributedDataParallel(model, device_ids=[rank]) names the GPU each process drives; with the
    CPU as the target the model is on the CPU, for which torch refuses device_ids. Patched on the
    class itself, not by a subclass in torch.nn.parallel: a program that imported the name first
    (``from torch.nn.parallel import DistributedDataParallel as DDP``, and every spawned child,
    which imports the program before redirection turns on there) holds the class itself."""
    original_init = ddp.__init__

    @functools.wraps(original_init)
    def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
        if device_ids is not None or output_device is not None:
            if all(p.device.type == "cpu" for p in module.parameters()):
                logger.info("DistributedDataParallel: device_ids=%r, output_device=%r dropped: the module "
                            "is on the CPU, the target", device_ids, output_device)
                device_ids = output_device = None
        original_init(self, module, device_ids, output_device, *args, **kwargs)
        self._torchbridge_lets_go_of_its_group = True  # read by _let_go_of_the_group at destruction

    patcher.replace(ddp, "__init__", __init__)
    # Not undone with redirection: a model made while it was on may outlive it, and its exit must
    # not hang then either. It acts on those models only.
    if "__del__" not in ddp.__dict__:
        ddp.__del__ = _let_go_of_the_group


def _let_go_of_the_group(self):
    """torch's Reducer binding destroys it with the GIL held (pytorch#56297). Where the reducer holds
    the last reference to a Gloo group (after destroy_process_group), ~ProcessGroupGloo joins Gloo's
    workers under the GIL while a worker dropping a finished all-reduce waits for the GIL: that
    work's thread-local state holds the Python context backward() stashes. Gloo on the CPU target is
    redirection's choice, so its exit must not hang: the reducer (and the logger, which shares it)
    go first while `group` keeps the group alive; the group's own binding then destroys it with the
    GIL released."""
    if not self.__dict__.get("_torchbridge_lets_go_of_its_group"):
        return
    group = self.__dict__.get("process_group")
    self.__dict__.pop("logger", None)
    self.__dict__.pop("reducer", None)
    del group
