"""UnifiedManager: one call prepares a model for the hardware that is there.

    from torchbridge import TorchBridgeConfig, UnifiedManager
    config = TorchBridgeConfig.for_training()
    manager = UnifiedManager(config)
    optimized_model = manager.optimize(model)              # or manager.optimize(model, optimizer)
    print(manager.report())

What each level does is decided in C++ (the optimization plan, ``include/torchbridge/optimize/plan.h``)
from the configuration, the device's capabilities and the model; this module carries the plan out
on a torch.nn.Module. It may turn a step into a skipped one when torch refuses it here (the report
says why), and never adds steps of its own.
"""

import contextlib
import copy
import dataclasses
import functools
import inspect
import itertools
import json

import torch
from torch.utils import _pytree as pytree
from torch.utils.dlpack import to_dlpack

from . import _C
from ._forward_wrapping import WrappedForward, wrap_forward
from ._int8_linear import quantize_linear_weights
from ._int8_linear import skip_reason as int8_skip_reason
from ._outputs import eval_mode, flatten
from ._recomputed_buffers import BufferStates, ChangingBuffers
from .fp8 import convert_to_fp8
from ._hardware_steps import hardware_step as _hardware_step
from .config import TorchBridgeConfig
from .precision import PrecisionDecision

__all__ = ["OptimizationReport", "OptimizationValidationError", "StepOutcome", "UnifiedManager"]


class OptimizationValidationError(ValueError):
    """The optimized model's outputs are outside the precision's bound around the original model's."""


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    name: str
    level: str
    outcome: str  # "applied" or "skipped"
    detail: str


@dataclasses.dataclass(frozen=True)
class OptimizationReport:
    backend: str
    device: str
    level: str
    training: bool
    precision: PrecisionDecision
    steps: "tuple[StepOutcome, ...]"

    def applied(self) -> "list[str]":
        return [s.name for s in self.steps if s.outcome == "applied"]

    def summary(self) -> str:
        """One line: what the level did beyond O0's placement, or that it did nothing more and why
        to look at the steps."""
        return self._steps_summary() + self._precision_note()

    def _precision_note(self) -> str:
        # A low precision decided or named at O0/O1 changes nothing yet: said, where the header's
        # "precision bf16" read as if the model computed in it.
        if self.level in ("O0", "O1") and self.precision.precision in ("bf16", "fp16", "fp8"):
            return (f"; precision {self.precision.precision} takes effect from O2 (autocast), so at {self.level} "
                    f"the model computes in its own dtypes")
        return ""

    def _steps_summary(self) -> str:
        if self.level == "O0":
            # O0's own steps beside placement (deterministic algorithms, validation) are said too.
            also = [s.name for s in self.steps if s.outcome == "applied" and s.name != "place"]
            return f"O0 on {self.device}: placed on the device" + (f", then {', '.join(also)}" if also else
                                                                    ", nothing else")
        beyond = [s.name for s in self.steps if s.level != "O0" and s.outcome != "skipped"]
        if not beyond:
            return (f"{self.level} applied nothing beyond O0 on {self.device}: every step of O1-{self.level} was "
                    f"skipped, each for the reason shown")
        return f"{self.level} on {self.device} applied {', '.join(beyond)}"

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), summary=self.summary())

    def to_json(self, indent=None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        lines = [f"{self.level} on {self.device} ({'training' if self.training else 'inference'}), "
                 f"precision {self.precision.precision}: {self.precision.reason}"]
        width = max((len(s.name) for s in self.steps), default=0)
        lines += [f"  {s.level} {s.name:<{width}}  {s.outcome:<7}  {s.detail}" for s in self.steps]
        lines.append(self.summary())
        return "\n".join(lines)


def _model_traits(model: torch.nn.Module, optimizer, example_inputs=None) -> dict:
    modules = list(model.modules())
    return {
        "has_example_inputs": example_inputs is not None,
        "torchscript": isinstance(model, torch.jit.ScriptModule),
        "has_convolutions": any(isinstance(m, torch.nn.Conv2d) for m in modules)
        or (isinstance(model, torch.jit.ScriptModule) and "Conv2d" in str(model.graph)),
        "has_linear": any(type(m) is torch.nn.Linear for m in modules),
        "has_int8_linear": any(type(m) is torch.nn.Linear and int8_skip_reason(m) is None for m in modules),
        "optimizer": "" if optimizer is None else type(optimizer).__name__,
        "has_block_container": _block_container(model) is not None,
    }


def _autocast_forward(forward, device_type: str, dtype: torch.dtype):
    """``forward(module, ...)`` under autocast, as a function of the module (_forward_wrapping)."""
    @functools.wraps(forward)
    def wrapped(module, *args, **kwargs):
        with torch.autocast(device_type=device_type, dtype=dtype):
            return forward(module, *args, **kwargs)

    return wrapped


def _compiled_forward(forward, backend: str):
    return torch.compile(forward, backend=backend)


def _fused_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer`` itself, switched to fused=True with its hyper-parameters and state (torch
    raises if the device or dtypes cannot use the fused kernel, and then nothing changed)."""
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        group.update(fused=True, foreach=None)
    groups = [dict(group, fused=True, foreach=None) for group in optimizer.param_groups]
    # defaults may hold keys the constructor does not take (AdamW records decoupled_weight_decay).
    accepted = inspect.signature(type(optimizer).__init__).parameters
    defaults = {k: v for k, v in dict(optimizer.defaults, fused=True, foreach=None).items()
                if k in accepted and k != "params"}
    rebuilt = type(optimizer)(groups, **defaults)
    rebuilt.load_state_dict(state)
    # The caller's object takes the fused one's groups, state and fused-only flags, keeping its
    # hooks: whatever refers to it stays attached. A new object left an LR scheduler made before
    # optimize() adjusting the old one's groups, so the learning rate silently stopped changing.
    original = set(vars(optimizer))
    for attribute, value in vars(rebuilt).items():
        if attribute in ("state", "param_groups", "defaults") or attribute not in original:
            setattr(optimizer, attribute, value)
    return optimizer


def _non_floating_parameters(optimizer: torch.optim.Optimizer) -> str:
    """The dtypes of the optimizer's parameters that are not floating point (complex ones), "" when
    none: torch's fused optimizers refuse them, at the first step()."""
    dtypes = {p.dtype for group in optimizer.param_groups for p in group["params"] if not p.is_floating_point()}
    return ", ".join(sorted(f"{dtype} parameters" for dtype in map(str, dtypes)))


def _sparse_gradient_layers(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> "list[str]":
    """The embedding layers built with sparse=True whose weight the optimizer steps, by name."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return [f"'{name}'" for name, module in model.named_modules()
            if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse
            and id(module.weight) in stepped]


class _Reference:
    """The original model's outputs in float64 on the CPU, taken before any step changes it."""

    def __init__(self, model: torch.nn.Module, inputs: tuple):
        self.inputs = inputs
        original = copy.deepcopy(model).to("cpu", torch.float64)
        with torch.no_grad(), eval_mode(original):
            self.outputs = flatten(original(*(_to(x, "cpu", torch.float64) for x in inputs)), skip_non_tensors=True)

    def check(self, model, device, precision: str) -> "tuple[str, str | None]":
        """(the step's detail, a failure message or None)."""
        with torch.no_grad(), eval_mode(model):
            results = flatten(model(*(_to(x, device) for x in self.inputs)), skip_non_tensors=True)
        if len(results) != len(self.outputs):
            return "", f"the optimized model returned {len(results)} tensors, the original {len(self.outputs)}"
        worst = None
        for i, (result, reference) in enumerate(zip(results, self.outputs)):
            check = _C.check_output(to_dlpack(result.detach().to("cpu", torch.float64).contiguous()),
                                    to_dlpack(reference.contiguous()), precision)
            if worst is None or not check["within"] or check["rel_l2_error"] > worst[1]["rel_l2_error"]:
                worst = (i, check)
            if not check["within"]:
                break
        i, check = worst
        detail = (f"{len(results)} output(s) within the {precision} bound; worst: output {i} relative L2 error "
                  f"{check['rel_l2_error']:.3g}, max abs error {check['max_abs_error']:.3g}, cosine "
                  f"{check['cosine_similarity']:.6f}")
        if check["within"]:
            return detail, None
        return (f"output {i} outside the {precision} bound: relative L2 error {check['rel_l2_error']:.3g}, cosine "
                f"{check['cosine_similarity']:.6f}",
                f"the optimized model's output {i} differs from the original model's beyond the {precision} bound "
                f"(relative L2 error {check['rel_l2_error']:.3g}, max abs error {check['max_abs_error']:.3g}, cosine "
                f"{check['cosine_similarity']:.6f}); see manager.report()")


def _to(value, device, dtype=None):
    """``value`` with every tensor in it (inside lists, tuples and dicts too) on ``device``, and
    floating-point ones cast to ``dtype`` when one is given."""
    def move(tensor):
        return tensor.to(device, dtype) if (dtype is not None and tensor.is_floating_point()) else tensor.to(device)

    return pytree.tree_map_only(torch.Tensor, move, value)


class UnifiedManager:
    """Chooses the backend, the device and the precision from a TorchBridgeConfig (refusing what
    the hardware cannot do before any model is touched) and applies the configured optimization
    level to models."""

    def __init__(self, config: "TorchBridgeConfig | None" = None):
        from .backends import BackendFactory

        if config is None:
            config = TorchBridgeConfig.for_training()
        if not isinstance(config, TorchBridgeConfig):
            raise TypeError(f"UnifiedManager needs a TorchBridgeConfig, got {type(config).__name__}")
        config.validate()
        # A deep copy: later changes to the caller's object, its hardware sections included, do not
        # leak in. The level as the C++ core spells it ("o2" is "O2"), as the report shows it.
        self.config = dataclasses.replace(copy.deepcopy(config),
                                          optimization_level=_C.parse_opt_level(config.optimization_level))
        backend_name = None if config.backend == "auto" else config.backend
        # The Python Backend loads SDK devices and gives the torch.device; the C++ manager decides.
        self.backend = BackendFactory.create(backend_name, config.device_index, config.optimization_level)
        if self.backend.name == "tpu":  # the C++ core said only "backend 'tpu' is not available"
            raise NotImplementedError(
                "UnifiedManager is not available for TPUs: its plan and precision policy are the C++ core's, which "
                "cannot describe TPUs (torch_xla is Python-only); use TPUBackend.prepare_model(model) (O0) and "
                "torch_xla's own tools, or TorchBridgeConfig(backend='cpu')")
        self._native = _C.UnifiedManager(json.dumps(dict(self.config.to_dict(), backend=self.backend.name)))
        self.precision = PrecisionDecision.from_json(self._native.precision_json())
        self._report = None
        self._traits = None  # the last optimize()'s model, as the plan saw it

    @property
    def device(self) -> torch.device:
        return self.backend.device

    def autocast(self):
        """The autocast context the configured level and precision use (a no-op context when they
        use none, or when the last optimized model runs without: a TorchScript one), for code that
        runs outside the optimized model's forward (e.g. the loss)."""
        dtype = self._autocast_dtype()
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def report(self) -> OptimizationReport:
        """What the last optimize() call applied and skipped, and why."""
        if self._report is None:
            raise RuntimeError("report() describes an optimize() call; call manager.optimize(model) first")
        return self._report

    def optimize(self, model: torch.nn.Module, optimizer: "torch.optim.Optimizer | None" = None, *,
                 example_inputs=None):
        """Applies the configured level to ``model`` (in place where torch allows) and returns the
        model to use, or ``(model, optimizer)`` when an optimizer is given: O1 may rebuild it with
        fused kernels, so train with the returned one. With ``config.validation`` and
        ``example_inputs`` (a tensor or a tuple of positional inputs, on any device), the optimized
        model's outputs are checked against the original model's in float64 on the CPU; outside the
        precision's output bound raises OptimizationValidationError (the report says by how much)."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"optimize needs a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if self.config.training != model.training:
            mode = "training" if self.config.training else "inference"
            raise ValueError(f"the configuration is for {mode} (training={self.config.training}) but the model is in "
                             f"{'training' if model.training else 'eval'} mode; call model."
                             f"{'train' if self.config.training else 'eval'}() first or change config.training")
        _check_not_prepared(model)
        _check_full_precision_model(model, self.precision.precision, named=self.config.precision != "auto")
        if example_inputs is not None and not isinstance(example_inputs, tuple):
            example_inputs = (example_inputs,)
        self._traits = _model_traits(model, optimizer, example_inputs)
        plan = json.loads(self._native.plan_json(json.dumps(self._traits)))
        validating = any(step["name"] == "validate" and step["apply"] for step in plan)
        reference = _Reference(model, example_inputs) if validating else None
        outcomes, failure = [], None
        for step in plan:
            detail = step["reason"]
            applied = step["apply"]
            if step["name"] == "validate" and applied:
                detail, failure = reference.check(model, self.device, self._computed_precision(model))
            elif applied:
                model, optimizer, refused, note = self._execute(step, model, optimizer)
                if refused:
                    applied, detail = False, refused
                elif note:
                    detail = note
            outcomes.append(StepOutcome(step["name"], step["level"], "applied" if applied else "skipped", detail))
        self._report = OptimizationReport(self.backend.name, str(self.device), self.config.optimization_level,
                                          self.config.training, self.precision, tuple(outcomes))
        if failure:
            # The steps ran in place: say so, since the caller's model object is the refused one.
            applied = ", ".join(o.name for o in outcomes if o.outcome == "applied" and o.name != "validate")
            raise OptimizationValidationError(
                f"{failure}. The model was optimized in place ({applied}) and is now the refused model; keep a "
                "copy (copy.deepcopy) before optimize to fall back to the original")
        return model if optimizer is None else (model, optimizer)

    def _autocast_dtype(self):
        # The last optimized model's traits: a TorchScript model's plan skips autocast, and
        # autocast() turned it on around that model anyway.
        traits = self._traits or _model_traits(torch.nn.Module(), None)  # before any: a model with nothing
        for step in json.loads(self._native.plan_json(json.dumps(traits))):
            if step["name"] == "autocast" and step["apply"]:
                return getattr(torch, step["argument"])
        return None

    def _computed_precision(self, model) -> str:
        """The precision whose bound the validate step holds the model to: the one it computes in.
        Below O2 there is no autocast and no cast, so that is the model's own lowest floating-point
        dtype, whatever precision was decided (bf16's 3% bound let a float32 model 2% off pass)."""
        if self.config.optimization_level not in ("O0", "O1"):
            return self.precision.precision
        names = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
        own = [names[t.dtype] for t in itertools.chain(model.parameters(), model.buffers()) if t.dtype in names]
        order = ["fp64", "fp32", "bf16", "fp16"]  # widest bound last
        return max(own, key=order.index) if own else "fp32"

    def _execute(self, step: dict, model, optimizer):
        """Carries out one applying step; returns (model, optimizer, refusal or None, what it did when
        the plan's reason does not say it, or None)."""
        name, argument = step["name"], step["argument"]
        if name == "place":
            model = model.to(self.device)
            if optimizer is not None:
                # Its state (Adam's moments) follows the parameters, as load_state_dict places it;
                # left behind, the first step raised "Expected all tensors to be on the same device".
                optimizer.load_state_dict(optimizer.state_dict())
        elif name == "deterministic":
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.deterministic = True
        elif name == "activation_checkpointing":
            checkpointed = _checkpoint_blocks(model)
            if checkpointed is None:  # the plan applies the step only to models with a block container
                raise RuntimeError("the optimization plan checkpoints blocks of a model that has none")
            caches_turned_off = _turn_off_key_value_caches(model)
            return model, optimizer, None, checkpointed.describe(type(model).__name__, caches_turned_off)
        elif name == "tf32":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        elif name == "cudnn_benchmark":
            torch.backends.cudnn.benchmark = True
        elif name == "fused_optimizer":
            not_floating = _non_floating_parameters(optimizer)
            if not_floating:  # torch accepts fused=True for them and raises at the first step()
                return model, optimizer, (f"torch's fused {type(optimizer).__name__} takes floating-point parameters "
                                          f"only, and the optimizer steps {not_floating}; the optimizer stays "
                                          f"unfused"), None
            sparse = _sparse_gradient_layers(model, optimizer)
            if sparse:  # torch accepts fused=True for them and raises at the first step()
                return model, optimizer, (f"torch's fused {type(optimizer).__name__} has no kernel for sparse "
                                          f"gradients, which the embedding layer(s) {', '.join(sparse)} give "
                                          f"(sparse=True); the optimizer stays unfused"), None
            try:
                optimizer = _fused_optimizer(optimizer)
            except (RuntimeError, ValueError, TypeError) as error:
                return model, optimizer, f"torch refused fused {type(optimizer).__name__} here: {error}", None
        elif name == "channels_last":
            # 4-D parameters only, as the C++ executor does: Module.to(memory_format=...) also takes
            # 5-D ones, which channels_last refuses, so a model with a Conv3d beside its Conv2d failed;
            # and buffers, which a model may read with .view() (that raised once they were restrided).
            with torch.no_grad():
                for parameter in model.parameters():
                    if parameter.dim() == 4:
                        parameter.data = parameter.data.contiguous(memory_format=torch.channels_last)
        elif name == "freeze_torchscript":
            model = torch.jit.optimize_for_inference(torch.jit.freeze(model))
        elif name == "autocast":
            wrap_forward(model, _autocast_forward, self.device.type, getattr(torch, argument))
        elif name == "low_precision_weights":
            return model, optimizer, None, _cast_weights(model, getattr(torch, argument))
        elif name == "compile":
            # The instance's forward, not Module.compile(): in torch 2.13 that compiles
            # Module._call_impl, which dynamo skips as torch-internal, so nothing was compiled
            # (no frame captured; seen on the CPU build). This keeps the module and its state-dict keys.
            # Compiled as a function of the module, bound to it: a copy runs with its own weights.
            wrap_forward(model, _compiled_forward, argument)
        elif name == "int8_weights":
            replaced, skipped_layers = quantize_linear_weights(model, torch.bfloat16)
            skipped = "; ".join(f"{layer}: {reason}" for layer, reason in skipped_layers)
            if not replaced:
                return model, optimizer, ("no nn.Linear to quantize (subclasses of Linear are left alone)" +
                                          (f"; {skipped}" if skipped else "")), None
            if skipped:
                return model, optimizer, None, (f"{len(replaced)} Linear layer(s) quantized; {len(skipped_layers)} "
                                                f"left in bf16 ({skipped})")
        elif name.startswith("hardware."):
            return _hardware_step(name, argument, model, optimizer, self.device)
        elif name == "fp8":
            converted = convert_to_fp8(model)
            skipped = "; ".join(f"{layer}: {reason}" for layer, reason in converted.skipped)
            if not converted.converted:
                return model, optimizer, f"no Linear layer could be converted ({skipped})", None
            note = f"{len(converted.converted)} Linear layer(s) converted"
            return model, optimizer, None, note + (f"; {len(converted.skipped)} skipped ({skipped})" if skipped else "")
        else:
            raise RuntimeError(f"the optimization plan has a step {name!r} the Python executor does not know")
        return model, optimizer, None, None


# Autocast runs these in float32 whatever the weights are, and their kernels refuse float32 inputs
# with bfloat16 weights ("mixed dtype (CPU): expect parameter to have scalar type of Float"): cast,
# every model with a normalization layer failed at inference. transformers keeps them float32 too.
_FLOAT32_LAYERS = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.RMSNorm)


def _cast_weights(model: torch.nn.Module, dtype: torch.dtype) -> str:
    """Casts the real floating-point parameters and buffers of every layer but normalization
    layers to ``dtype``, in place; complex ones stay (a cast to a real dtype drops the imaginary
    part). Returns what it did, for the report."""
    kept = set()

    def cast(tensor):
        return tensor.to(dtype) if tensor.is_floating_point() else tensor

    for module in model.modules():
        if isinstance(module, _FLOAT32_LAYERS):
            kept.add(type(module).__name__)
            continue
        module._apply(cast, recurse=False)
    complex_count = sum(1 for t in [*model.parameters(), *model.buffers()] if t.is_complex())
    note = f"inference: floating-point parameters and buffers cast to {str(dtype).replace('torch.', '')}"
    if kept:
        note += f", except in {', '.join(sorted(kept))} layers, which autocast runs in float32"
    if complex_count:
        note += f"; {complex_count} complex tensor(s) kept as they are"
    return note


def _check_not_prepared(model: torch.nn.Module) -> None:
    """A second optimize() stacked a second autocast and compile on the first (dynamo then raised
    "compile_wrapper already has a get_compiler_config attribute") or checkpointed blocks twice."""
    made_by_optimize = {_autocast_forward: "autocast", _compiled_forward: "compile",
                        _checkpointed_forward: "activation checkpointing"}
    for name, module in model.named_modules():
        forward = module.__dict__.get("forward")
        if not isinstance(forward, WrappedForward):
            continue
        steps = [made_by_optimize[make] for make, _ in forward._steps if make in made_by_optimize]
        if steps:
            where = f"its layer '{name}'" if name else "it"
            raise ValueError(f"the model was already prepared by UnifiedManager.optimize ({where} runs "
                             f"{', '.join(steps)}); optimize the original model, or a copy made before the first "
                             f"optimize, once")


def _check_full_precision_model(model, precision: str, named: bool) -> None:
    """fp64 means the model computes in float64 as given: optimize lowers nothing (no TF32, no
    autocast) but casts nothing up either (float32 inputs would then not match). A model with other
    floating-point parameters would compute in their dtype while the report said float64. fp32
    asked for by name is held to the same rule below it: a float16 or bfloat16 model computed in
    its own dtype while the report said fp32."""
    if precision == "fp64":
        lower, advice = {p.dtype for p in model.parameters() if p.is_floating_point()} - {torch.float64}, \
            "cast it with model.double() (and give it float64 inputs) before optimize, or ask for fp32"
    elif precision == "fp32" and named:
        lower, advice = {p.dtype for p in model.parameters() if p.dtype in (torch.float16, torch.bfloat16)}, \
            "cast it with model.float() before optimize, or ask for the precision it has (fp16, bf16)"
    else:
        return
    if lower:
        names = ", ".join(sorted(str(dtype).replace("torch.", "") for dtype in lower))
        raise ValueError(f"precision {precision}: the model's floating-point parameters are {names}, so it would "
                         f"compute in that precision; {advice}")


@dataclasses.dataclass(frozen=True)
class _CheckpointedBlocks:
    container: str  # its name in the model ("" for the model itself)
    blocks: "tuple[torch.nn.Module, ...]"  # each distinct block wrapped, in container order
    listed: int  # how many entries of the container they fill (more when one block is listed several times)

    def describe(self, model_type: str, caches_turned_off: int) -> str:
        """The report's detail: what was wrapped, and what runs otherwise than the user may think."""
        count = len(self.blocks)
        detail = f"{count} block{'' if count == 1 else 's'} of '{self.container or model_type}' checkpointed"
        if self.listed > count:
            detail += f" (listed {self.listed} times: each call is a region of its own)"
        frozen = sum(1 for block in self.blocks if not _trains_parameters(block))
        if frozen:
            detail += (f"; {frozen} of them train no parameter, so a call of one is checkpointed only when an input "
                       f"requires grad (otherwise backward never reaches it and it runs as it is)")
        if caches_turned_off:
            detail += ("; use_cache turned off in the model's config, as Hugging Face's gradient checkpointing does "
                       "(a layer fills the key/value cache in its forward pass, and its recomputation would attend "
                       "over those keys twice); pass use_cache=True where inference wants the cache")
        return detail


def _checkpoint_blocks(model) -> "_CheckpointedBlocks | None":
    """Makes each block of the model's first container of repeated blocks (an nn.Sequential or
    nn.ModuleList of two or more, in module order: a transformer's layer list) run as a
    checkpointed region while training with gradients. Blocks without parameters (activations,
    pooling, dropout) are left as they are: they hold no activations worth recomputing, and an
    in-place one (ReLU(inplace=True)) cannot be a region of its own, since it modifies its own input.
    A block listed several times (weights shared across layers, as ALBERT does) is wrapped once: a
    wrapper per entry nested the regions, and the block ran 5 times per call instead of 2.
    Buffers a block changes (normalizations' running statistics, a spectral norm's vectors) change
    once per step, and are recomputed from where the forward pass started (_recomputed_buffers.py),
    as without checkpointing. Returns what it wrapped, or None when the model has no such container."""
    from . import memory

    found = _block_container(model)
    if found is None:
        return None
    name, container = found
    listed = [block for block in container if _holds_parameters(block)]
    blocks = tuple(dict.fromkeys(listed))  # modules hash by identity: each distinct block, in order
    for block in blocks:
        wrap_forward(block, _checkpointed_forward, memory.checkpoint)
    return _CheckpointedBlocks(name, blocks, len(listed))


def _turn_off_key_value_caches(model) -> int:
    """Sets ``use_cache`` to False in the configs of the model's Hugging Face modules, as their
    gradient checkpointing does in training, and returns how many were on. A decoder layer called
    with a cache appends its keys and values to it in the forward pass; recomputed in backward, it
    ran attention over them twice: 22 of 30 gradients of a small Llama wrong, silently (sdpa), or a
    size mismatch (eager)."""
    configs = {id(config): config for config in (getattr(module, "config", None) for module in model.modules())
               if getattr(config, "use_cache", None) is True}
    for config in configs.values():
        config.use_cache = False
    return len(configs)


def _block_container(model) -> "tuple[str, torch.nn.Module] | None":
    """The model's first nn.Sequential or nn.ModuleList of two or more blocks, some holding
    parameters (the ones checkpointed), with its name."""
    for name, container in model.named_modules():
        if isinstance(container, (torch.nn.Sequential, torch.nn.ModuleList)) and len(container) >= 2 \
                and any(_holds_parameters(block) for block in container):
            return name, container
    return None


def _holds_parameters(module) -> bool:
    return any(True for _ in module.parameters())


def _trains_parameters(module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def _needs_a_region(block, args, kwargs) -> bool:
    """Whether backward can reach this call: a block that trains no parameter, given no input that
    requires grad (frozen lower layers), saves nothing for backward, so a region would only warn
    that nothing in it trains. Decided per call: the same frozen block does need a region when its
    input requires grad (a trained embedding below it), and a block may be unfrozen later."""
    if _trains_parameters(block):
        return True
    return any(isinstance(value, torch.Tensor) and value.requires_grad
               for value in pytree.tree_flatten((args, kwargs))[0])


def _looks_like_a_key_value_cache(value) -> bool:
    # transformers' Cache classes (DynamicCache, StaticCache, EncoderDecoderCache, ...), by what
    # they do rather than by import: the forward pass fills them through update().
    return not isinstance(value, torch.Tensor) and callable(getattr(value, "update", None)) \
        and callable(getattr(value, "get_seq_length", None))


def _refuse_a_key_value_cache(block, args, kwargs) -> None:
    """A cache the block's forward pass fills is filled again by its recomputation, which then
    attends over twice the keys: wrong gradients, silently. Refused rather than computed wrong."""
    leaves = pytree.tree_flatten((args, kwargs), is_leaf=_looks_like_a_key_value_cache)[0]
    cache = next((value for value in leaves if _looks_like_a_key_value_cache(value)), None)
    if cache is not None:
        raise ValueError(
            f"activation checkpointing: the checkpointed block {type(block).__name__} was given a "
            f"{type(cache).__name__}, a key/value cache its forward pass fills; its recomputation in backward would "
            f"fill it again and attend over those keys twice, giving wrong gradients. Call the model with "
            f"use_cache=False while training (Hugging Face's gradient checkpointing turns it off too), or "
            f"without activation checkpointing")


def _checkpointed_forward(forward, checkpoint):
    changing = ChangingBuffers()  # learned by the block's first forward pass

    @functools.wraps(forward)
    def run(block, *args, **kwargs):
        if block.training and torch.is_grad_enabled() and _needs_a_region(block, args, kwargs):
            _refuse_a_key_value_cache(block, args, kwargs)
            # The block's arguments go in as a tuple and a dict: as keywords, one named like an option of
            # checkpoint's (early_stop, debug, determinism_check...) was taken as that option.
            return checkpoint(_run_checkpointed_block, forward, block, BufferStates(block, changing), args, kwargs,
                              use_reentrant=False)
        return forward(block, *args, **kwargs)

    return run


def _run_checkpointed_block(forward, block, buffers, args, kwargs):
    """The block's forward, for its forward pass or its recomputation: the recomputation starts from
    the buffers the forward pass started from and leaves them as the forward pass did
    (_recomputed_buffers.py)."""
    call = functools.partial(forward, block, *args, **kwargs)
    return buffers.recompute(call) if _C._recomputing() else buffers.forward(call)
