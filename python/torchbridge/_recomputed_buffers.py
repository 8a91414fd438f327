"""A checkpointed block's buffers across its forward pass and its recomputation, for the
configuration's activation checkpointing, which promises training as without checkpointing.

Recomputed in training mode, a block changes its buffers a second time: batch and instance
normalization's running statistics move twice per step, and a parametrized spectral norm runs its
power iteration again, from the vectors the forward pass left, so the recomputed weight is not the
one the forward pass used and the gradients are wrong (0.006 at the first step, measured).
torch.utils.checkpoint does the same; the configuration chooses the regions for the user, so it
must not. The recomputation therefore runs on copies of the buffers as they were before the
forward pass, and what the forward pass left is put back after it.

Copying every buffer before every forward pass would cost a step what the block's constant
buffers (masks, position tables) weigh, so a block's first forward pass copies them all and
notes which ones it changes (in place, which kernels such as batch_norm's do without bumping the
version, so the values are compared; or by assigning another tensor); later ones copy only those.
A buffer that changes for the first time in a later step is recomputed from a copy of the value
the forward pass left: updated once, though a block that also reads it recomputes from the newer
value (a warning says so)."""

import warnings

import torch


def _buffers(block):
    """(qualified name, module, buffer name, tensor) for every buffer of ``block``, None ones too."""
    for prefix, module in block.named_modules():
        for name, tensor in module._buffers.items():
            yield (f"{prefix}.{name}" if prefix else name), module, name, tensor


class ChangingBuffers:
    """The names of the buffers a block's forward pass changes, learned by its first one; one per
    checkpointed block, shared by its calls."""

    def __init__(self):
        self.learned = False
        self.names = set()


class BufferStates:
    """One checkpointed call of a block: ``forward`` runs its forward pass, keeping the values the
    buffers it changes had before; ``recompute`` runs the recomputation on copies of them."""

    def __init__(self, block, changing: ChangingBuffers):
        self._block, self._changing = block, changing
        self._before = {}
        self._changed = None  # (qualified name, module, buffer name) after the forward pass

    def forward(self, run):
        buffers = list(_buffers(self._block))
        seen = {qualified: (tensor, None if tensor is None else tensor._version) for qualified, _, _, tensor in buffers}
        with torch.no_grad():
            self._before = {qualified: None if tensor is None else tensor.clone() for qualified, _, _, tensor in buffers
                            if not self._changing.learned or qualified in self._changing.names}
        result = run()
        self._changed = []
        for qualified, module, name, now in _buffers(self._block):
            then, version = seen.get(qualified, (None, None))
            changed = (qualified in self._changing.names or now is not then
                       or (now is not None and now._version != version))
            if not changed and not self._changing.learned and now is not None:
                # Kernels write some buffers without bumping their version (batch_norm's running
                # statistics): the first pass compares values too.
                with torch.no_grad():
                    changed = not torch.equal(self._before[qualified], now)
            if not changed:
                continue
            self._changed.append((qualified, module, name))
            if qualified not in self._changing.names and self._changing.learned:
                warnings.warn(f"activation checkpointing: buffer {qualified!r} changed in this forward pass for the "
                              "first time; the recomputation starts from the value the forward pass left, not the "
                              "one it started from", RuntimeWarning, stacklevel=2)
            self._changing.names.add(qualified)
        for qualified in list(self._before):
            if qualified not in self._changing.names:
                del self._before[qualified]  # constant: nothing to restore
        self._changing.learned = True
        return result

    def recompute(self, run):
        # Without a forward pass of its own (a region inside another region's recomputation), every
        # buffer is swapped for a copy of itself: updated once, at least.
        changed = self._changed if self._changed is not None else \
            [(qualified, module, name) for qualified, module, name, _ in _buffers(self._block)]
        left = []
        with torch.no_grad():
            for qualified, module, name in changed:
                now = module._buffers[name]
                before = self._before.get(qualified, now)
                left.append((module, name, now))
                module._buffers[name] = None if before is None else before.clone()
        try:
            return run()
        finally:
            # Swapped back, not copied: a write would bump the versions the recomputed graph saved.
            for module, name, tensor in left:
                module._buffers[name] = tensor
