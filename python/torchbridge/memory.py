"""Memory for training: activation checkpointing with torch.utils.checkpoint's interface, computed
by TorchBridge's C++ implementation (``include/torchbridge/memory/activation_checkpoint.h``), and
optimizer-state offload (``OffloadedAdam``, ``OffloadedAdamW``; ``offloaded_optimizer.h``) and
activation offload (``offload_activations``, in Python: ``_activation_offload`` says why).

``checkpoint`` and ``checkpoint_sequential`` take torch's arguments and give torch's results: the
gradients are bit-identical to ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` and
to running without checkpointing (tested on the CPU and emu), with dropout (random state replayed),
autocast, nested regions, non-tensor arguments and outputs, ``backward()`` and
``torch.autograd.grad``. The same code serves C++ programs, which have no checkpointing in LibTorch.

Differences from torch:
- only the non-reentrant kind exists: ``use_reentrant=True`` raises ``ValueError``;
- ``context_fn`` other than the default and ``debug=True`` raise ``NotImplementedError``;
- the recomputation always runs the whole function; ``early_stop`` (torch stops recomputing once
  the tensors backward needs exist) is accepted for compatibility and changes only that cost;
- only tensors passed as arguments (positional or keyword) are checked for in-place changes before
  backward; tensors the function captures from outside are used as they are then.
"""

import functools
import warnings

import torch
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import noop_context_fn

from . import _C
from ._activation_offload import offload_activations  # noqa: F401  (re-exported)

__all__ = ["OffloadedAdam", "OffloadedAdamW", "checkpoint", "checkpoint_sequential", "offload_activations"]

_DETERMINISM_CHECKS = ("default", "none")


def _tensors_in(values):
    return [value for value in values if isinstance(value, torch.Tensor)]


def _check_options(use_reentrant, context_fn, determinism_check, debug, respect_saved_tensors_hooks):
    if respect_saved_tensors_hooks is not None and not isinstance(respect_saved_tensors_hooks, bool):
        raise TypeError(f"torchbridge.memory.checkpoint: respect_saved_tensors_hooks must be None, True or False, "
                        f"got {respect_saved_tensors_hooks!r}")
    if use_reentrant:
        raise ValueError(
            "torchbridge.memory.checkpoint implements use_reentrant=False only (it works when no input "
            "requires grad, with torch.autograd.grad and nested regions); pass use_reentrant=False or None, "
            "or use torch.utils.checkpoint for the reentrant variant")
    if context_fn is not noop_context_fn:
        raise NotImplementedError("torchbridge.memory.checkpoint: context_fn is not supported; the recomputation "
                                  "runs under the forward pass's autocast and random state")
    if determinism_check not in _DETERMINISM_CHECKS:
        raise ValueError(f"torchbridge.memory.checkpoint: determinism_check must be one of "
                         f"{list(_DETERMINISM_CHECKS)}, got {determinism_check!r}")
    if debug:
        raise NotImplementedError("torchbridge.memory.checkpoint: debug=True is not supported")


def checkpoint(function=None, *args, use_reentrant=None, preserve_rng_state=True, context_fn=noop_context_fn,
               determinism_check="default", debug=False, early_stop=True, respect_saved_tensors_hooks=None,
               **kwargs):
    """``function(*args, **kwargs)`` with its activations recomputed during backward instead of kept.

    The signature is torch 2.14's, which takes every call torch 2.11-2.13 accept: called without
    ``function`` (and without arguments), it returns a decorator that checkpoints every call of the
    function it wraps with these options. ``respect_saved_tensors_hooks`` concerns tensors that
    selective checkpointing saves; this implementation saves none (``context_fn`` is refused), so,
    as in torch without it, the value changes nothing; it must be None or a bool.
    """
    _check_options(use_reentrant, context_fn, determinism_check, debug, respect_saved_tensors_hooks)
    if function is None and not args:
        if kwargs:
            raise ValueError(f"torchbridge.memory.checkpoint: keyword arguments {sorted(kwargs)} given without a "
                             f"function; the decorator form takes only checkpoint's own options")
        options = dict(use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state, context_fn=context_fn,
                       determinism_check=determinism_check, debug=debug, early_stop=early_stop,
                       respect_saved_tensors_hooks=respect_saved_tensors_hooks)
        return lambda wrapped: functools.wraps(wrapped)(
            lambda *call_args, **call_kwargs: checkpoint(wrapped, *call_args, **options, **call_kwargs))
    if not callable(function):
        raise TypeError(f"torchbridge.memory.checkpoint: function must be callable, got {type(function).__name__}")
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return function(*args, **kwargs)

    inputs = _tensors_in(list(args) + list(kwargs.values()))
    region = _C._CheckpointRegion([t._cdata for t in inputs], bool(preserve_rng_state), determinism_check == "default")
    outputs = function(*args, **kwargs)
    flat, spec = pytree.tree_flatten(outputs)
    tensors = _tensors_in(flat)
    attached = [t.detach() if t.requires_grad else None for t in tensors]
    if all(a is None for a in attached):
        # torch allows it (a region of frozen layers), but the memory the user wanted to save is for
        # a backward pass that cannot reach this region.
        warnings.warn(f"torchbridge.memory.checkpoint: none of the region's {len(tensors)} tensor outputs requires "
                      f"grad (no input or parameter it uses does), so backward never reaches the region and nothing "
                      f"is recomputed; a backward through these outputs fails with torch's 'does not require grad'. "
                      f"Checkpoint regions that train, or run this one under torch.no_grad()", stacklevel=2)

    def recompute():
        # Runs during backward, on autograd's thread; returns the tensors and their addresses.
        again = _tensors_in(pytree.tree_flatten(function(*args, **kwargs))[0])
        return again, [t._cdata for t in again]

    region.finish([t._cdata for t in tensors], [0 if a is None else a._cdata for a in attached], recompute)
    replacements = iter(attached)
    result = []
    for value in flat:
        if isinstance(value, torch.Tensor):
            replacement = next(replacements)
            value = value if replacement is None else replacement
        result.append(value)
    return pytree.tree_unflatten(result, spec)


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """torch.utils.checkpoint.checkpoint_sequential: ``segments`` checkpointed segments of
    ``len(functions) // segments`` modules, the last segment (with any remainder) run plainly."""
    preserve_rng_state = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise TypeError(f"checkpoint_sequential: unexpected keyword arguments {sorted(kwargs)}")
    if isinstance(functions, torch.nn.Sequential):
        functions = list(functions.children())
    functions = list(functions)
    if not isinstance(segments, int) or isinstance(segments, bool) or not 1 <= segments <= len(functions):
        raise ValueError(f"checkpoint_sequential: segments must be an int between 1 and the number of "
                         f"functions ({len(functions)}), got {segments!r}")

    def run(begin, end):
        def forward(x):
            for function in functions[begin:end]:
                x = function(x)
            return x
        return forward

    size = len(functions) // segments
    begin = 0
    for _ in range(segments - 1):
        input = checkpoint(run(begin, begin + size), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve_rng_state)
        begin += size
    return run(begin, len(functions))(input)


class _OffloadedAdamFamily:
    """Adam/AdamW with its state and float32 master weights in pinned host memory, stepped on the CPU
    by torch's C++ optimizer; gradients are copied down and parameters up on a side stream, bucket by
    bucket, so copies overlap the CPU's work (torchbridge::memory::OffloadedOptimizer). The device
    keeps only parameters and gradients.

    Not a torch.optim.Optimizer: one parameter group, no state_dict, and LR schedulers do not drive
    it (set ``lr`` instead). Parameters must be float32 and on one accelerator."""

    _KIND = ""
    _DEFAULT_WEIGHT_DECAY = 0.0

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=None, amsgrad=False, *,
                 bucket_bytes=32 << 20):
        self.params = list(params)
        for i, p in enumerate(self.params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"{type(self).__name__}: parameter {i} is a {type(p).__name__}; expected tensors "
                                f"(parameter groups given as dicts are not supported)")
        if weight_decay is None:
            weight_decay = self._DEFAULT_WEIGHT_DECAY
        beta1, beta2 = betas
        self._lr = float(lr)
        self._impl = _C._OffloadedOptimizer([p._cdata for p in self.params], self._KIND, self._lr, float(beta1),
                                            float(beta2), float(eps), float(weight_decay), bool(amsgrad),
                                            int(bucket_bytes))

    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value) -> None:
        self._impl.set_lr(float(value))
        self._lr = float(value)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._impl.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()


class OffloadedAdam(_OffloadedAdamFamily):
    __doc__ = _OffloadedAdamFamily.__doc__
    _KIND = "adam"
    _DEFAULT_WEIGHT_DECAY = 0.0


class OffloadedAdamW(_OffloadedAdamFamily):
    __doc__ = _OffloadedAdamFamily.__doc__
    _KIND = "adamw"
    _DEFAULT_WEIGHT_DECAY = 1e-2
