"""Memory for training: activation checkpointing with torch.utils.checkpoint's interface, computed
by TorchBridge's C++ implementation (``include/torchbridge/memory/activation_checkpoint.h``), and
optimizer-state offload (``OffloadedAdam``, ``OffloadedAdamW``; ``offloaded_optimizer.h``) and
activation offload (``offload_activations``, in Python: ``_activation_offload`` says why).

``checkpoint`` and ``checkpoint_sequential`` take torch's arguments and give torch's results: the
gradients are bit-identical to ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` and
to running without checkpointing (tested on the CPU and emu), with dropout (random state replayed),
autocast, nested regions, non-tensor arguments and outputs, ``backward()`` and
``torch.autograd.grad``. The same code serves C++ programs, which have no checkpointing in LibTorch.
Second-order gradients (``create_graph=True``) agree to float rounding, not bit for bit, when the
first-order gradient depends on the region's outputs (``y.pow(2).sum()``): the second backward
then reaches the region's one recomputing node, which sums its part of each gradient before
handing it on, where torch (which keeps the region's graph and swaps only its saved tensors) adds
the same terms one by one in another grouping (3.7e-9 of 0.039 measured). When it does not
(``y.sum()``, a penalty on the input gradient of a linear loss) they are bit-identical too.
Under ``torch.compile`` the region runs eagerly (a graph break), with the same gradients.

Differences from torch:
- only the non-reentrant kind exists: ``use_reentrant=True`` raises ``ValueError``;
- ``context_fn`` other than the default and ``debug=True`` raise ``NotImplementedError``
  (``torchbridge.fp8.checkpoint_contexts`` is taken: every region keeps that record already);
- the recomputation always runs the whole function; ``early_stop`` (torch stops recomputing once
  the tensors backward needs exist) is accepted for compatibility and changes only that cost;
- only tensors passed as arguments (positional or keyword, also inside lists, tuples and dicts) are
  checked for in-place changes before backward; tensors the function captures from outside are used
  as they are then.
"""

import functools
import math
import warnings

import torch
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import noop_context_fn

from . import _C
from ._after_import import when_imported
from ._integer import as_integer
from ._activation_offload import offload_activations  # noqa: F401  (re-exported)
from .fp8 import checkpoint_contexts

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
    # checkpoint_contexts gives torch's checkpoint the record every region here keeps already, so
    # code written for torch's checkpoint with it runs unchanged.
    if context_fn is not noop_context_fn and context_fn is not checkpoint_contexts:
        raise NotImplementedError("torchbridge.memory.checkpoint: context_fn is not supported (except "
                                  "torchbridge.fp8.checkpoint_contexts, whose record every region keeps); the "
                                  "recomputation runs under the forward pass's autocast and random state")
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
    selective checkpointing saves; this implementation saves none (it takes no selective
    checkpointing ``context_fn``), so,
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
    result, untrained_outputs = _call_outside_compile(function, args, kwargs, preserve_rng_state, determinism_check)
    if untrained_outputs is not None:
        # torch allows it (a region of frozen layers), but the memory the user wanted to save is for
        # a backward pass that cannot reach this region.
        warnings.warn(f"torchbridge.memory.checkpoint: none of the region's {untrained_outputs} tensor outputs "
                      f"requires grad (no input or parameter it uses does), so backward never reaches the region and "
                      f"nothing is recomputed; a backward through these outputs fails with torch's 'does not require "
                      f"grad'. Checkpoint regions that train, or run this one under torch.no_grad()", stacklevel=2)
    return result


def _call(function, args, kwargs, preserve_rng_state, determinism_check):
    """``function(*args, **kwargs)``, as a checkpointed region while autograd records, and the
    number of its tensor outputs when none of them requires grad (None when some does or when
    autograd does not record)."""
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return function(*args, **kwargs), None
    return _region(function, args, kwargs, preserve_rng_state, determinism_check)


def _region(function, args, kwargs, preserve_rng_state, determinism_check):
    """_call's result while autograd records: the outputs, those that require grad replaced by the
    detached aliases that carry the region's one recomputing node."""
    # Tensors inside lists, tuples and dicts count as inputs too: their devices' random state is
    # replayed (dropout on a device whose tensor came in a tuple drew a different mask when
    # recomputed) and they are checked for in-place changes.
    inputs = _tensors_in(pytree.tree_flatten((args, kwargs))[0])
    region = _C._CheckpointRegion([t._cdata for t in inputs], bool(preserve_rng_state), determinism_check == "default")
    outputs = function(*args, **kwargs)
    flat, spec = pytree.tree_flatten(outputs)
    tensors = _tensors_in(flat)
    attached = [t.detach() if t.requires_grad else None for t in tensors]

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
    untrained_outputs = len(tensors) if all(a is None for a in attached) else None
    return pytree.tree_unflatten(result, spec), untrained_outputs


# torch.compile traced into the region and broke the graph at the C++ calls: the tensors handed
# to the region were then not the ones the compiled code returned, so the checkpointed layers got
# no gradient, silently (or the region refused a missing alias). Dynamo leaves a function that
# torch.compiler.disable wraps to run eagerly, with everything it calls (fullgraph=True refuses it,
# giving the reason below). Wrapping imports torch._dynamo (about 1 s), so it happens when
# something imports it: no compile runs before.
_call_outside_compile = _call


def _keep_regions_out_of_compile(dynamo) -> None:
    global _call_outside_compile
    # torch._dynamo.disable is torch.compiler.disable's; called on the module just imported, which
    # may not be an attribute of torch yet.
    _call_outside_compile = dynamo.disable(_call, recursive=True, reason=(
        "torchbridge.memory.checkpoint runs its function eagerly: its C++ region replaces the autograd nodes the "
        "forward pass made, which a traced graph does not have"))


when_imported(["torch._dynamo"], _keep_regions_out_of_compile)


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """torch.utils.checkpoint.checkpoint_sequential: ``segments`` checkpointed segments of
    ``len(functions) // segments`` modules, the last segment (with any remainder) run plainly."""
    preserve_rng_state = kwargs.pop("preserve_rng_state", True)
    if kwargs:  # torch's error, word for word
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if isinstance(functions, torch.nn.Sequential):
        functions = list(functions.children())
    functions = list(functions)
    count = as_integer(segments)  # any integer, as torch takes it (numpy's too)
    if count is None or not 1 <= count <= len(functions):
        raise ValueError(f"checkpoint_sequential: segments must be an int between 1 and the number of "
                         f"functions ({len(functions)}), got {segments!r}")
    segments = count

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


def _check_learning_rate(lr) -> None:
    if not 0.0 <= lr:  # NaN fails too
        raise ValueError(f"Invalid learning rate: {lr}")


class _OffloadedAdamFamily:
    """Adam/AdamW with its state and float32 master weights in pinned host memory, stepped on the CPU
    by torch's C++ optimizer; gradients are copied down and parameters up on a side stream, bucket by
    bucket, so copies overlap the CPU's work (torchbridge::memory::OffloadedOptimizer). The device
    keeps only parameters and gradients.

    ``state_dict()`` / ``load_state_dict()`` use ``torch.optim.Adam``'s (``AdamW``'s) format, so
    either optimizer loads the other's (the state tensors are in host memory). Parameters written
    between steps (``model.load_state_dict`` after the optimizer was built) are what the next step
    updates; writes through ``p.data`` bypass the version counter that shows them and are not
    seen. Not a torch.optim.Optimizer: one parameter group, and LR schedulers do not drive it (set
    ``lr`` instead). Parameters must be float32 and on one accelerator."""

    STATE_FORMAT = ""  # the torch optimizer whose state it keeps ("Adam" or "AdamW"), as training-state files name it
    _DEFAULT_WEIGHT_DECAY = 0.0

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=None, amsgrad=False, *,
                 bucket_bytes=32 << 20):
        if isinstance(params, torch.Tensor):  # list() would make its rows the parameters, trained by nobody
            raise TypeError(f"{type(self).__name__}: params should be an iterable of Tensors, got a single tensor "
                            f"{params.type()} {list(params.shape)}; pass [tensor]")
        self.params = list(params)
        for i, p in enumerate(self.params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"{type(self).__name__}: parameter {i} is a {type(p).__name__}; expected tensors "
                                f"(parameter groups given as dicts are not supported)")
            if not p.is_leaf:  # torch.optim's words: a computed tensor's updates would reach nothing
                raise ValueError(f"{type(self).__name__}: can't optimize a non-leaf Tensor (parameter {i})")
        if weight_decay is None:
            weight_decay = self._DEFAULT_WEIGHT_DECAY
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"{type(self).__name__}: betas must be two numbers, got {betas!r}")
        beta1, beta2 = betas
        size = as_integer(bucket_bytes)
        if size is None:
            raise TypeError(f"{type(self).__name__}: bucket_bytes must be an int number of bytes, got "
                            f"{type(bucket_bytes).__name__} {bucket_bytes!r}")
        if not 0 < size < 2**63:
            raise ValueError(f"{type(self).__name__}: bucket_bytes must be positive and below 2**63, got {size}")
        # torch.optim.Adam's checks and words (ValueError; the C++ optimizer's were RuntimeErrors).
        _check_learning_rate(lr)
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for index, beta in enumerate((beta1, beta2)):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {index}: {beta}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        self._lr = float(lr)
        self._betas, self._eps = (float(beta1), float(beta2)), float(eps)
        self._weight_decay, self._amsgrad = float(weight_decay), bool(amsgrad)
        self._impl = _C._OffloadedOptimizer([p._cdata for p in self.params], self.STATE_FORMAT.lower(), self._lr,
                                            float(beta1), float(beta2), float(eps), float(weight_decay),
                                            bool(amsgrad), size)

    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value) -> None:
        value = float(value)
        _check_learning_rate(value)  # the constructor's check: NaN made every parameter NaN at the next step
        self._impl.set_lr(value)
        self._lr = value

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_dense_gradients()
        self._impl.step()
        return loss

    def _check_dense_gradients(self) -> None:
        """torch.optim.Adam's refusal, before anything is stepped: the host step copied a sparse
        gradient (nn.Embedding(sparse=True)) and failed with torch's "copy_() between dense and
        sparse Tensors", naming neither the parameter nor the cause."""
        for i, p in enumerate(self.params):
            if p.grad is not None and p.grad.layout != torch.strided:
                raise RuntimeError(f"{self.STATE_FORMAT} does not support sparse gradients, please consider SparseAdam "
                                   f"instead: {type(self).__name__}'s parameter {i} {list(p.shape)} has a "
                                   f"{p.grad.layout} gradient (nn.Embedding and nn.EmbeddingBag give one with "
                                   f"sparse=True)")

    @property
    def param_groups(self) -> "list[dict]":
        """The one parameter group, as torch.optim's ``param_groups`` lists it. Setting its "lr"
        sets ``lr`` (warm-up code does); setting anything else raises instead of changing nothing."""
        return [_ParamGroup(self, {**self._hyperparameters(), "params": list(self.params)})]

    def _hyperparameters(self) -> dict:
        return {"lr": self._lr, "betas": self._betas, "eps": self._eps, "weight_decay": self._weight_decay,
                "amsgrad": self._amsgrad, "maximize": False, "foreach": None, "capturable": False,
                "differentiable": False, "fused": None, "decoupled_weight_decay": self.STATE_FORMAT == "AdamW"}

    def state_dict(self) -> dict:
        """``torch.optim.Adam``'s format (``AdamW``'s for OffloadedAdamW): per parameter index
        ``step``, ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with amsgrad) as CPU tensors,
        and one parameter group."""
        state = {}
        for i, p in enumerate(self.params):
            summary = self._impl.state_summary(i)
            if summary is None:  # no step yet, as torch's optimizers leave it out
                continue
            step, has_max = summary
            names = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if has_max else ())
            entry = {name: torch.empty(p.shape, dtype=torch.float32) for name in names}
            self._impl.copy_state_into(i, entry["exp_avg"]._cdata, entry["exp_avg_sq"]._cdata,
                                       entry["max_exp_avg_sq"]._cdata if has_max else 0)
            state[i] = {"step": torch.tensor(float(step)), **entry}
        return {"state": state, "param_groups": [{**self._hyperparameters(), "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes what ``state_dict`` returns, or ``torch.optim.Adam``'s / ``AdamW``'s for the same
        parameters in the same order. Everything is checked before anything changes."""
        (lr, beta1, beta2, eps, weight_decay, amsgrad), entries = _checked_adam_state(
            state_dict, self.params, type(self).__name__, self.STATE_FORMAT == "AdamW")
        # Nothing below raises for checked values: the tensors are CPU float32 of the right shapes.
        self._impl.set_options(lr, beta1, beta2, eps, weight_decay, amsgrad)
        for i, entry in enumerate(entries):
            if entry is None:
                self._impl.clear_state(i)
                continue
            tensors = [entry["exp_avg"], entry["exp_avg_sq"], entry.get("max_exp_avg_sq")]
            self._impl.load_state(i, entry["step"], tensors[0]._cdata, tensors[1]._cdata,
                                  0 if tensors[2] is None else tensors[2]._cdata)
        self._lr, self._betas, self._eps = lr, (beta1, beta2), eps
        self._weight_decay, self._amsgrad = weight_decay, amsgrad

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
                continue
            # As torch.optim does: detach_() only a gradient with a graph; one that is a view (of
            # DataParallel's buckets, with gradient_as_bucket_view) cannot be detached in place.
            if p.grad.grad_fn is not None:
                p.grad.detach_()
            else:
                p.grad.requires_grad_(False)
            p.grad.zero_()


class _ParamGroup(dict):
    """A view of an offloaded optimizer's one parameter group whose "lr" writes through."""

    def __init__(self, owner, values):
        super().__init__(values)
        self._owner = owner

    def __setitem__(self, key, value):
        if key != "lr":
            raise TypeError(f"{type(self._owner).__name__}.param_groups[0][{key!r}] cannot be changed: only 'lr' "
                            "can (build a new optimizer for other settings)")
        self._owner.lr = value
        super().__setitem__(key, self._owner.lr)

    # dict's own update and setdefault do not call __setitem__: "lr" would change nothing and
    # other keys would not be refused.
    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]


def _finite(value, what: str, refuse) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        refuse(f"{what} is {value!r}; expected a number")
    if not math.isfinite(number):
        refuse(f"{what} is {value!r}; expected a finite number")
    return number


def _checked_adam_state(state_dict, params, owner: str, adamw: bool):
    """((lr, beta1, beta2, eps, weight_decay, amsgrad), per parameter its state entry, or None, with an
    int step and CPU float32 tensors), or ValueError naming what does not fit ``params``."""
    def refuse(why):
        raise ValueError(f"{owner}.load_state_dict: {why}")

    if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= state_dict.keys():
        refuse(f"expected a dict with 'state' and 'param_groups' (an optimizer's state_dict), got {state_dict!r:.80}")
    groups = state_dict["param_groups"]
    if not isinstance(groups, (list, tuple)) or len(groups) != 1:
        count = len(groups) if isinstance(groups, (list, tuple)) else repr(groups)
        refuse(f"this optimizer has one parameter group; the state has {count}")
    group = groups[0]
    missing = [k for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "params") if k not in group]
    if missing:
        refuse(f"the parameter group lacks {', '.join(missing)}")
    ids = list(group["params"])
    if len(ids) != len(params):
        refuse(f"the state is for {len(ids)} parameters; this optimizer has {len(params)}")
    if group.get("maximize", False):
        refuse("maximize=True is not supported (torch's C++ Adam, which steps the host copies, has no such option)")
    if group.get("decoupled_weight_decay", adamw) != adamw:
        refuse(f"the state is {'AdamW' if not adamw else 'Adam'}'s (decoupled_weight_decay="
               f"{group['decoupled_weight_decay']}); load it into {'OffloadedAdamW' if not adamw else 'OffloadedAdam'}")
    if not isinstance(group["betas"], (list, tuple)) or len(group["betas"]) != 2:
        refuse(f"betas is {group['betas']!r}; expected two numbers")
    settings = (_finite(group["lr"], "lr", refuse), *(_finite(b, "betas", refuse) for b in group["betas"]),
                _finite(group["eps"], "eps", refuse), _finite(group["weight_decay"], "weight_decay", refuse),
                bool(group["amsgrad"]))
    saved = state_dict["state"]
    unknown = [k for k in saved if k not in ids]
    if unknown:
        refuse(f"state for parameter ids {unknown} that the parameter group does not list")
    names = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
    entries = []
    for position, (key, param) in enumerate(zip(ids, params)):
        entry = saved.get(key)
        if entry is None:
            entries.append(None)
            continue
        for name in names:
            value = entry.get(name)
            if (not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(param.shape)
                    or not value.is_floating_point() or value.is_meta):
                described = (f"{value.dtype} {tuple(value.shape)}{' on meta' if value.is_meta else ''}"
                             if isinstance(value, torch.Tensor) else repr(value))
                refuse(f"parameter {position}'s {name} is {described}; expected a floating-point tensor of "
                       f"shape {tuple(param.shape)}")
        step = entry.get("step")
        step = step.item() if isinstance(step, torch.Tensor) and step.numel() == 1 else step
        if (isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 <= step < 2**63
                or step != int(step)):
            refuse(f"parameter {position}'s step is {entry.get('step')!r}; expected a whole number >= 0")
        tensors = {name: entry[name].detach().to("cpu", torch.float32).contiguous() for name in names}
        entries.append({**tensors, "step": int(step)})
    return settings, entries


class OffloadedAdam(_OffloadedAdamFamily):
    __doc__ = _OffloadedAdamFamily.__doc__
    STATE_FORMAT = "Adam"
    _DEFAULT_WEIGHT_DECAY = 0.0


class OffloadedAdamW(_OffloadedAdamFamily):
    __doc__ = _OffloadedAdamFamily.__doc__
    STATE_FORMAT = "AdamW"
    _DEFAULT_WEIGHT_DECAY = 1e-2
