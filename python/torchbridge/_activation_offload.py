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
from ._integer import as_integer


def _is_a_parameter(tensor) -> bool:
    """Whether ``tensor`` is a parameter or a view of one (autograd often saves a view: a Linear
    saves ``weight.t()``, whose ``_base`` is the weight). A frozen parameter (requires_grad=False,
    as LoRA's base weights) is a Parameter all the same, though not a leaf that requires grad;
    other leaves that require grad are tensors the caller trains and holds, as parameters."""
    base = tensor if tensor._base is None else tensor._base
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


def _device_bytes(tensor) -> int:
    """The device memory ``tensor`` holds: its storage's. A broadcast (stride-0) view of a 4 KiB
    tensor counts 4 KiB, not the 32 MiB its shape spans; a slice counts all it keeps alive."""
    return tensor.untyped_storage().nbytes()


def _copy_bytes(tensor) -> int:
    """The host copy's size, and the size of the device copy brought back: dense, as empty_like."""
    return tensor.numel() * tensor.element_size()


def _layout_key(tensor) -> tuple:
    """What makes two saved tensors the same values, given the same live storage and version."""
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
            tensor.dtype, tensor.device)


class _Offloaded:
    """One distinct saved tensor while it lives on the host, however many times autograd saved it
    (q, k and v projections all save the same hidden state)."""

    __slots__ = ("host", "device", "orders", "on_device", "arrived", "source", "version", "storage",
                 "unpacks_left", "__weakref__")

    def __init__(self, host, device, source):
        self.host = host            # pinned copy
        self.device = device
        self.orders = []            # the positions of its saves among the forward pass's saves
        self.on_device = None       # the copy brought back, until backward's last use of it
        self.arrived = None         # event on the side stream after the copy back
        # The tensor saved, weakly, and its version then: see _check_unchanged.
        self.source = weakref.ref(source)
        self.version = source._version
        # Weakly: a later save shares this record only while the very storage lives (its address
        # alone could be a new tensor's, allocated where a freed one was).
        self.storage = weakref.ref(source.untyped_storage())
        self.unpacks_left = 0       # uses left in this backward pass before its device copy goes

    def holds_the_values_of(self, tensor) -> bool:
        return self.storage() is tensor.untyped_storage() and tensor._version == self.version

    def position_of_this_use(self) -> int:
        """The forward position of the save that backward most likely unpacks now: backward runs
        the saving ops in reverse, so the latest save not yet unpacked in this pass."""
        return self.orders[max(self.unpacks_left, 1) - 1]


class _Kept:
    """One saved tensor left where it is, with its version then: autograd checks no tensor that
    saved-tensor hooks hold, kept or offloaded, so _check_unchanged does it for both."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor):
        self.tensor = tensor
        self.version = tensor._version


def _forget(table, key, dead_reference):
    """A record's weak-reference callback: its entry leaves the context's table, unless a newer
    record took that key over."""
    if table.get(key) is dead_reference:
        del table[key]


class offload_activations(saved_tensors_hooks):  # noqa: N801  (a context manager, named like torch's)
    """``with offload_activations(): loss = model(x)`` moves what autograd saves in the block to
    pinned host memory, and brings it back during backward. Gradients are bit-identical to no
    offload (the copies are exact).

    - Forward: each saved tensor on an accelerator whose storage holds at least ``min_bytes`` is
      copied to a pinned host buffer on a side stream that first waits for the compute stream (an
      event), so the copy starts after the tensor is computed and overlaps later forward work. The
      device memory is kept from reuse until that copy has read it (``record_stream``).
    - Backward: when autograd needs a tensor, it is copied back on the side stream if it is not
      back already, and the compute stream waits for that copy (an event), never the CPU. The
      ``prefetch`` tensors saved just before it are started back at the same time, because
      backward needs them next.
    - One tensor saved by several ops (q, k and v projections of one hidden state), or through
      views with the same storage, offset, shape and strides at the same version, is copied once,
      brought back once and shared, and its device copy goes with backward's last use of it.
    - Kept as they are: CPU tensors, tensors whose storage is below ``min_bytes`` (a broadcast view
      counts what its storage holds, not what its shape spans), broadcast views whose dense copy
      would be larger than their storage, parameters (trainable or frozen) and other leaves that
      require grad, and views of them (e.g. a Linear's transposed weight: the module holds them on
      the device anyway, so a copy would free nothing).
    """

    def __init__(self, min_bytes: int = 1 << 16, prefetch: int = 2):
        self.min_bytes = _non_negative_integer("min_bytes", min_bytes)
        self.prefetch = _non_negative_integer("prefetch", prefetch)
        self._side_streams = {}
        self._accepted = set()  # devices _check_on_the_accelerator has accepted
        # Weak references to the records by the forward position of each save, and by _layout_key
        # (a later save of the same values shares the record); an entry leaves when its record
        # dies, so a context reused step after step holds only what live graphs still save (a list
        # grew by every saved tensor of every step).
        self._saved = {}
        self._by_layout = {}
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

    def _stays_on_device(self, tensor) -> bool:
        if tensor.device.type == "cpu" or tensor.layout != torch.strided or _is_a_parameter(tensor):
            return True
        # A broadcast view's dense copy, brought back, would take more device memory than it frees.
        return _device_bytes(tensor) < self.min_bytes or _copy_bytes(tensor) > _device_bytes(tensor)

    def _pack(self, tensor):
        if self._stays_on_device(tensor):
            return _Kept(tensor)
        self._check_on_the_accelerator(tensor.device)
        record = self._offloaded_before(tensor) or self._offload(tensor)
        self._note_save(record)
        return record

    def _note_save(self, record):
        order = self._next_order
        self._next_order += 1
        record.orders.append(order)
        record.unpacks_left += 1
        self._saved[order] = weakref.ref(record, functools.partial(_forget, self._saved, order))

    def _offloaded_before(self, tensor):
        """The record of an earlier save of the same values, or None. Copying each save apart cost
        host memory and copy time per saving op, and prefetch brought back one device copy per op
        (peak memory above no offload's)."""
        reference = self._by_layout.get(_layout_key(tensor))
        record = reference() if reference is not None else None
        return record if record is not None and record.holds_the_values_of(tensor) else None

    def _offload(self, tensor):
        side = self._side_waits_for_compute(tensor.device)
        # Pinned by the tensor's own device type: pin_memory=True would pin for CUDA whenever the
        # machine has CUDA, and an SDK device copies CUDA's pinned memory synchronously.
        host = torch.empty(0, dtype=tensor.dtype)
        _C._pin_host_like(host._cdata, tensor._cdata)
        with side:
            host.copy_(tensor, non_blocking=True)
        tensor.record_stream(side)
        record = _Offloaded(host, tensor.device, tensor)
        key = _layout_key(tensor)
        self._by_layout[key] = weakref.ref(record, functools.partial(_forget, self._by_layout, key))
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
        source = record.source()
        self._check_unchanged(source, record.version)
        if source is None and record.on_device is None:
            self._bring_back(record)
        self._prefetch_before(record)
        if source is None:
            self._compute_waits_for(record)
        return self._hand_over(record, source)

    def _prefetch_before(self, record):
        position = record.position_of_this_use()
        for earlier in range(position - 1, max(-1, position - 1 - self.prefetch), -1):
            reference = self._saved.get(earlier)
            other = reference() if reference is not None else None
            if other is not None and other.on_device is None and other.source() is None:
                self._bring_back(other)

    @staticmethod
    def _hand_over(record, source):
        """The tensor for one use: the saved tensor itself while something else keeps it alive on
        the device (a copy back would hold its memory twice, above no offload's peak), otherwise
        the device copy. The record lets go of that at the last use of this backward pass, so its
        memory goes with backward's use, as without offload; a second backward (retain_graph)
        brings it back again."""
        tensor = source if source is not None else record.on_device
        record.unpacks_left -= 1
        if record.unpacks_left <= 0:
            record.on_device, record.unpacks_left = None, len(record.orders)
        return tensor


def _non_negative_integer(name: str, value) -> int:
    """``value`` as an int (numpy's integers too, as checkpoint_sequential takes them), or
    ValueError naming the option."""
    number = as_integer(value)
    if number is None or number < 0:
        raise ValueError(f"offload_activations: {name} must be a non-negative int, got {value!r}")
    return number
