"""Data-parallel training for ``torch.nn.Module`` s on devices torch's own
``DistributedDataParallel`` cannot serve: SDK devices (PrivateUse1, such as ``emu``). torch's DDP
talks to Gloo, which takes CPU tensors only (and CUDA ones in CUDA builds), and it checks and
broadcasts the parameters on their own device before any hook can step in. TorchBridge's C++
``DataParallel`` (``include/torchbridge/distributed/data_parallel.h``), on the same
``c10d::Reducer`` that DDP drives, moves an SDK device's gradient buckets through host memory.

When to use what:

- CPU, CUDA (NCCL), ROCm: ``torch.nn.parallel.DistributedDataParallel``, and FSDP2
  (``torch.distributed.fsdp.fully_shard``) to shard parameters. They have more features
  (``static_graph``, mixed-precision reductions, ``find_unused_parameters`` on every device) and this
  module adds nothing to them but its error naming a lost rank.
- An SDK device: ``torchbridge.distributed.DataParallel``. Same arithmetic as DDP (buckets of
  ``bucket_cap_mb``, in reverse registration order, overlapped with backward; the mean of the
  ranks' gradients), tested equal to one process on the whole batch, and to DDP on the CPU.

Launch with torchrun, as for DDP::

    torchrun --nproc-per-node 2 train.py

    import torchbridge.distributed as tbd
    torchbridge.devices.load("emu")          # before the first backward pass of the process
    group = tbd.init()                       # torchrun's environment; alone: a world of one
    model = tbd.DataParallel(MyModel().to("emu:0"), group)
    loss = criterion(model(x_share), y_share)
    model.backward(loss)                     # not loss.backward(): this call averages gradients
    optimizer.step()

It needs no ``torch.distributed.init_process_group``; a program may still call it (under torchrun
both join torchrun's store, under their own key prefixes).
"""

import contextlib
import numbers

import torch

from . import _C

__all__ = ["DataParallel", "ProcessGroup", "init"]

ProcessGroup = _C._ProcessGroup

# The timeout travels as int64 milliseconds and c10d turns some into int64 nanoseconds: longer
# than this (about 292 years) would overflow.
_LONGEST_TIMEOUT_S = (2**63 - 1) / 1e9


def init(timeout: float = 60.0, device: str = "cpu") -> ProcessGroup:
    """Joins the process group torchrun's environment describes (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ...), or a world of one when none of it is set. ``timeout`` (seconds) bounds
    the rendezvous and every collective; a lost rank makes the others raise naming it.
    ``device`` picks the collective backend: Gloo for the CPU and SDK devices; NCCL for cuda (with
    Gloo beside it for CPU tensors), where torch's own DDP is the tool for ``nn.Module``s."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a backend name such as 'cpu', 'emu' or 'cuda' (or a torch.device), got "
                        f"{type(device).__name__}")
    if not 0.001 <= timeout < _LONGEST_TIMEOUT_S:
        # It travels in whole milliseconds: 0.0009 was "must be positive, got 0 ms".
        raise ValueError(f"timeout must be a finite number of seconds from 0.001 (a millisecond) to below "
                         f"{_LONGEST_TIMEOUT_S:.0f}, got {timeout!r}")
    return ProcessGroup.init(int(timeout * 1000), str(device))


def _sparse_gradient_refusal(module) -> str:
    """Why DataParallel refuses ``module``'s sparse embeddings, "" when it has none that train:
    c10d's reducer buckets dense gradients only, and a sparse embedding's gradient would fail inside
    backward with "Cannot access storage of SparseTensorImpl", naming nothing."""
    for name, submodule in module.named_modules():
        # A frozen one makes no gradient, and the reducer never sees it.
        if isinstance(submodule, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and submodule.sparse \
                and submodule.weight.requires_grad:
            return (f"DataParallel: module {name or '(the model)'!r} makes sparse gradients (sparse=True), "
                    "which DataParallel does not reduce; construct it with sparse=False")
    return ""


class DataParallel(torch.nn.Module):
    """Wraps ``module``: rank 0's parameters and buffers are broadcast to every rank (whose
    models must have the same parameter shapes: a difference is an error naming the ranks and
    the parameter); ``backward(loss)`` leaves every parameter's gradient averaged over the ranks.
    Calling the wrapper calls ``module``. The parameters must be on one device: the CPU or an SDK
    device. As in DDP:

    - ``gradient_as_bucket_view``: gradients become views into the all-reduce buckets, which saves
      copying them back (and in, while they are zeroed in place rather than set to None); a
      gradient then must not be detached in place or given new storage.
    - ``broadcast_buffers``: after each ``backward`` that averages gradients, every rank's buffers
      (BatchNorm's running statistics) become rank 0's. DDP broadcasts them before each forward;
      the next forward sees the same values either way, and what a rank saves after a step is the
      same on every rank.
    - ``find_unused_parameters``: parameters a step leaves without a gradient are found by walking
      the graph from the loss (on the CPU; an SDK device refuses it, its reducer would exchange a
      device tensor through Gloo)."""

    def __init__(self, module: torch.nn.Module, group: ProcessGroup, bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0, gradient_as_bucket_view: bool = False,
                 broadcast_buffers: bool = True, find_unused_parameters: bool = False):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"DataParallel wraps a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(group, ProcessGroup):
            raise TypeError("DataParallel needs the group torchbridge.distributed.init() returns, got "
                            f"{type(group).__name__}")
        for name, size in (("bucket_cap_mb", bucket_cap_mb), ("first_bucket_mb", first_bucket_mb)):
            if isinstance(size, bool) or not isinstance(size, numbers.Real):
                raise TypeError(f"{name} must be a number of MiB, got {type(size).__name__} {size!r}")
            if not 0 < size * 2**20 < 2**63:  # NaN fails too
                raise ValueError(f"{name} must be positive and below 2**43 MiB, got {size!r}")
        flags = {"gradient_as_bucket_view": gradient_as_bucket_view, "broadcast_buffers": broadcast_buffers,
                 "find_unused_parameters": find_unused_parameters}
        for name, flag in flags.items():
            # bool("no") and bool("False") are True: a string turned the option on.
            if not isinstance(flag, (bool, numbers.Integral)) or flag not in (0, 1):
                raise TypeError(f"{name} must be True or False, got {type(flag).__name__} {flag!r}")
        # Refused on every rank when one rank's model has them: the others would otherwise wait for it.
        group.refuse_together("DataParallel", _sparse_gradient_refusal(module))
        self.module = module
        # Every parameter: frozen ones are broadcast from rank 0 too (the C++ side reduces the trained ones).
        named = list(module.named_parameters())
        buffers = list(module.buffers())
        # The C++ side holds its own references to these tensors; the lists keep them alive for the call.
        self._impl = _C._DataParallel([name for name, _ in named], [p._cdata for _, p in named],
                                      [b._cdata for b in buffers], group, int(bucket_cap_mb * 2**20),
                                      int(first_bucket_mb * 2**20), bool(gradient_as_bucket_view),
                                      bool(broadcast_buffers), bool(find_unused_parameters))
        self.group = group

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, with the gradients averaged over every rank (inside ``no_sync()``:
        kept local)."""
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise ValueError("DataParallel.backward needs a loss tensor computed from the module's parameters")
        self._impl.backward(loss._cdata)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside keep their gradients local (gradient accumulation); the next
        ``backward`` outside reduces the accumulated sum."""
        previous = self._impl.synchronize()
        self._impl.set_synchronize(False)
        try:
            yield
        finally:
            self._impl.set_synchronize(previous)
