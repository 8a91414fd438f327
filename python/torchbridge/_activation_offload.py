"""Activation offload: tensors autograd saves during the forward pass go to pinned host memory and
come back before backward needs them, asynchronously on a side stream (torchbridge.memory re-exports
``offload_activations``).

Why Python: the hooks this needs are autograd's saved-tensor hooks, and in LibTorch 2.13 the default
ones exist only as Python objects (``at::SavedTensorDefaultHooks`` stores ``c10::SafePyObject``), so
a C++ library cannot install them. Streams and events here are torch's own (``torch.Stream``,
``torch.Event``), which are the device's through its guard: CUDA's, or an SDK device's."""

import functools
import weakref

import torch
from torch.autograd.graph import saved_tensors_hooks

from . import _C


def _is_a_parameter(tensor) -> bool:
    """Whether ``tensor`` is a parameter or a view of one (autograd often saves a view: a Linear
    saves ``weight.t()``, whose ``_base`` is the weight). A frozen parameter (requires_grad=False,
    as LoRA's base weights) is a Parameter all the same, though not a leaf that requires grad;
    other leaves that require grad are tensors the caller trains and holds, as parameters."""
    base = tensor if tensor._base is None else tensor._base
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


class _Offloaded:
    """One saved tensor while it lives on the host."""

    __slots__ = ("host", "device", "order", "on_device", "arrived", "source", "version", "__weakref__")

    def __init__(self, host, device, order, source):
        self.host = host            # pinned copy
        self.device = device
        self.order = order          # position in the forward pass
        self.on_device = None       # the copy brought back, until backward takes it
        self.arrived = None         # event on the side stream after the copy back
        # The tensor saved, weakly, and its version then: see _check_unchanged.
        self.source = weakref.ref(source)
        self.version = source._version


class _Kept:
    """One saved tensor left where it is, with its version then: autograd checks no tensor that
    saved-tensor hooks hold, kept or offloaded, so _check_unchanged does it for both."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor):
        self.tensor = tensor
        self.version = tensor._version


def _forget(saved, order, _dead_reference):
    """A record's weak-reference callback: its entry leaves the context's table."""
    saved.pop(order, None)


class offload_activations(saved_tensors_hooks):  # noqa: N801  (a context manager, named like torch's)
    """``with offload_activations(): loss = model(x)`` moves what autograd saves in the block to
    pinned host memory, and brings it back during backward. Gradients are bit-identical to no
    offload (the copies are exact).

    - Forward: each saved tensor on an accelerator of at least ``min_bytes`` is copied to a pinned
      host buffer on a side stream that first waits for the compute stream (an event), so the
      copy starts after the tensor is computed and overlaps later forward work. The device memory
      is kept from reuse until that copy has read it (``record_stream``).
    - Backward: when autograd needs a tensor, it is copied back on the side stream if it is not
      back already, and the compute stream waits for that copy (an event), never the CPU. The
      ``prefetch`` tensors saved just before it are started back at the same time, because
      backward needs them next.
    - Kept as they are: CPU tensors, tensors below ``min_bytes``, parameters (trainable or frozen)
      and other leaves that require grad, and views of them (e.g. a Linear's transposed weight: the
      module holds them on the device anyway, so a copy would free nothing).
    """

    def __init__(self, min_bytes: int = 1 << 16, prefetch: int = 2):
        for name, value in (("min_bytes", min_bytes), ("prefetch", prefetch)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"offload_activations: {name} must be a non-negative int, got {value!r}")
        self.min_bytes = min_bytes
        self.prefetch = prefetch
        self._side_streams = {}
        self._accepted = set()  # devices _check_on_the_accelerator has accepted
        # Weak references by forward order; an entry leaves when its record dies, so a context
        # reused step after step holds only what live graphs still save (a list grew by every
        # saved tensor of every step).
        self._saved = {}
        self._next_order = 0
        super().__init__(self._pack, self._unpack)

    def _side_stream(self, device):
        if device not in self._side_streams:
            self._side_streams[device] = torch.Stream(device=device)
        return self._side_streams[device]

    def _side_waits_for_compute(self, device):
        side = self._side_stream(device)
        ready = torch.Event(device=device)
        ready.record(torch.accelerator.current_stream(device))
        side.wait_event(ready)
        return side

    def _check_on_the_accelerator(self, device):
        # The copies run on torch.accelerator's streams and events, which serve the process's
        # accelerator only, into host memory pinned for that device type.
        if device in self._accepted:
            return
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is None or accelerator.type != device.type:
            name = accelerator.type if accelerator is not None else "none"
            raise RuntimeError(
                f"offload_activations: a saved tensor is on {device}, but this process's accelerator is {name}, "
                f"and offload runs on the accelerator's devices only (its copies are ordered by "
                f"torch.accelerator's streams and events); run the block on {name} or without offload_activations")
        self._accepted.add(device)

    def _pack(self, tensor):
        if (tensor.device.type == "cpu" or tensor.layout != torch.strided
                or tensor.numel() * tensor.element_size() < self.min_bytes or _is_a_parameter(tensor)):
            return _Kept(tensor)
        self._check_on_the_accelerator(tensor.device)
        side = self._side_waits_for_compute(tensor.device)
        # Pinned by the tensor's own device type: pin_memory=True would pin for CUDA whenever the
        # machine has CUDA, and an SDK device copies CUDA's pinned memory synchronously.
        host = torch.empty(0, dtype=tensor.dtype)
        _C._pin_host_like(host._cdata, tensor._cdata)
        with side:
            host.copy_(tensor, non_blocking=True)
        tensor.record_stream(side)
        order = self._next_order
        self._next_order += 1
        record = _Offloaded(host, tensor.device, order, tensor)
        self._saved[order] = weakref.ref(record, functools.partial(_forget, self._saved, order))
        return record

    def _bring_back(self, record):
        # The new device memory may still be in use by compute-stream work queued before, so the
        # side stream waits for the compute stream before writing it.
        side = self._side_waits_for_compute(record.device)
        tensor = self._device_buffer(record)
        with side:
            tensor.copy_(record.host, non_blocking=True)
        tensor.record_stream(side)
        record.arrived = torch.Event(device=record.device)
        record.arrived.record(side)
        record.on_device = tensor

    def _device_buffer(self, record):
        """The device memory a copy back lands in (its own method so that tests can poison it)."""
        return torch.empty_like(record.host, device=record.device)

    def _compute_waits_for(self, record):
        torch.accelerator.current_stream(record.device).wait_event(record.arrived)

    @staticmethod
    def _check_unchanged(tensor, version):
        """Autograd skips its check of a saved tensor's version when saved-tensor hooks hold it. Kept
        tensors came back as they were then: one changed in place after the forward pass (a CPU
        tensor, a small one, a parameter changed under no_grad) gave the gradient at its new value,
        where torch without offload refuses. Offloaded ones are copied to the host on a side stream
        that a later in-place write on the compute stream may overtake, so their gradients depended
        on timing (22239 apart). Refused as torch does; an offloaded tensor only while it lives (its
        record holds it weakly, so one changed and then freed is not seen)."""
        if tensor is not None and tensor._version != version:
            raise RuntimeError(
                f"one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{tensor.type()} {list(tensor.shape)}] is at version {tensor._version}; expected version "
                f"{version} instead (offload_activations saved it for backward; change it after backward, or change a "
                f"clone of it)")

    def _unpack(self, record):
        if isinstance(record, _Kept):
            self._check_unchanged(record.tensor, record.version)
            return record.tensor
        self._check_unchanged(record.source(), record.version)
        if record.on_device is None:
            self._bring_back(record)
        for earlier in range(record.order - 1, max(-1, record.order - 1 - self.prefetch), -1):
            reference = self._saved.get(earlier)
            other = reference() if reference is not None else None
            if other is not None and other.on_device is None:
                self._bring_back(other)
        self._compute_waits_for(record)
        tensor, record.on_device = record.on_device, None  # device memory goes with backward's use
        return tensor
