"""Cross-backend validation of Python models through the C++ Validator.

``UnifiedValidator().validate_model(model, input_shape=(4, 16, 32))`` runs the model's forward
and backward on the CPU in float64 (the reference) and on every selected backend, and checks
outputs and gradients against the reference (dtype-aware tolerances), NaN/Inf, determinism, a
save-and-reload round trip, and that device memory returns to its baseline. The checks,
tolerances and report live in C++ (the same code as ``torchbridge validate``); this module only
places and runs copies of the Python model when the C++ side asks.
"""

import copy
import io
import json
import os
import tempfile
from dataclasses import dataclass, field

import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

from . import _C
from ._integer import as_integer
from ._outputs import flatten

__all__ = ["UnifiedValidator", "ValidationResult", "builtin_model", "builtin_model_names"]


@dataclass
class ValidationResult:
    """What ``validate_model`` found. ``checks`` holds one dict per check with every measured
    value (``max_abs_error``, ``max_rel_error``, ``rel_l2_error``, ``cosine_similarity`` for
    comparisons)."""

    passed: int
    total_tests: int
    failed: int
    is_valid: bool
    precision: str
    reference: str
    backends: "list[str]"
    checks: "list[dict]" = field(repr=False)
    not_checked: "list[str]" = field(repr=False)
    seconds: dict = field(repr=False)
    report: dict = field(repr=False)  # the whole report, as `torchbridge validate --json` prints it

    @property
    def failures(self) -> "list[dict]":
        return [c for c in self.checks if not c["passed"]]

    def __str__(self) -> str:
        lines = [f"{self.passed}/{self.total_tests} checks passed on {', '.join(self.backends)} "
                 f"({self.precision} against {self.reference}): {'VALID' if self.is_valid else 'NOT VALID'}"]
        lines += [f"  FAILED {c['backend']} {c['check']} {c['subject']}: {c['detail']}" for c in self.failures]
        return "\n".join(lines)


def builtin_model_names() -> "list[str]":
    return list(_C.builtin_model_names())


def builtin_model(name: str, seed: int = 0) -> torch.jit.ScriptModule:
    """A built-in model (mlp, cnn, transformer) as a TorchScript module, the same one
    ``torchbridge validate --model builtin:NAME`` uses. Its input shape:
    ``torchbridge._C.builtin_model_input_shape(name)``."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"{name}.pt")
        _C.save_builtin_model(name, path, int(seed))
        return torch.jit.load(path)


class UnifiedValidator:
    """Validates models on ``backends`` (default: the CPU and the best available backend).

    Backends are resolved when the validator is made, so an SDK device such as ``emu`` is loaded
    then (before the process's first backward pass, as PyTorch requires) and an unknown or
    unavailable backend raises at once."""

    def __init__(self, backends: "list[str] | str | None" = None, dtype: "str | torch.dtype" = "fp32", seed: int = 0):
        from .backends import BackendFactory, detect_best_backend

        if backends is None:
            best = detect_best_backend()
            backends = ["cpu"] if best == "cpu" else ["cpu", best]
        elif isinstance(backends, str):
            backends = [b for b in backends.split(",")]
        if not backends or any(not isinstance(b, str) or not b for b in backends):
            raise ValueError(f"backends must be non-empty backend names, got {backends!r}")
        # As the CLI refuses --backends cpu,CPU (names ignore case): a backend compared with itself
        # checks nothing.
        lowered = [b.lower() for b in backends]
        twice = sorted({b for b in lowered if lowered.count(b) > 1})
        if twice:
            raise ValueError(f"backends {backends!r} name {twice[0]!r} twice")
        # An SDK device beside CUDA (or another native accelerator) cannot share this process:
        # refused, naming both and the way out, before anything is loaded.
        _C.check_backends_can_share_a_process(list(backends), "validate")
        written_as = {}
        for name in backends:
            backend = BackendFactory.create(name).name  # raises naming the backend; loads SDK devices
            # Two spellings of one backend (emu and privateuseone, cuda and nvidia) ran every check twice
            # on one device; the CLI refuses them alike.
            if backend in written_as:
                raise ValueError(f"backends {backends!r} name backend {backend!r} twice ({written_as[backend]!r} "
                                 f"and {name!r})")
            written_as[backend] = name
        self.backends = list(backends)
        self.dtype = _check_precision(dtype)
        # Any integer (numpy's too), checked here rather than as the binding's TypeError later.
        self.seed = as_integer(seed)
        if self.seed is None or not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be an integer from 0 to 2**64 - 1, got {seed!r}")

    def validate_model(self, model: torch.nn.Module, input_shape=None, inputs=None,
                       dtype: "str | torch.dtype | None" = None, progress=None) -> ValidationResult:
        """Validates ``model`` (an ``nn.Module`` or TorchScript module; it is never modified) on
        random normal inputs of ``input_shape`` (a shape, or a list of shapes for several
        inputs), or on explicit CPU ``inputs``. ``progress(backend, step, done, total)`` is called
        before each step."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or TorchScript module, got {type(model).__name__}")
        if progress is not None and not callable(progress):
            raise TypeError(f"progress must be a function (backend, step, done, total) or None, got "
                            f"{type(progress).__name__}")
        tensors = _inputs(input_shape, inputs, self.seed)
        kind = "TorchScript" if isinstance(model, torch.jit.ScriptModule) else "Python nn.Module"

        def place(device: str, dtype_name: str, round_through: "str | None"):
            return _PlacedModel(model, torch.device(device), getattr(torch, dtype_name),
                                None if round_through is None else getattr(torch, round_through))

        report = json.loads(_C.validate_python_model(
            place, kind, [to_dlpack(t.contiguous()) for t in tensors], self.backends, _check_precision(dtype or self.dtype),
            self.seed, progress))
        return ValidationResult(
            passed=report["passed"], total_tests=report["total_tests"], failed=report["failed"],
            is_valid=report["valid"], precision=report["precision"], reference=report["reference"],
            backends=report["backends"], checks=report["checks"], not_checked=report["not_checked"],
            seconds=report["seconds"], report=report)


_PRECISIONS = ("fp64", "fp32", "bf16", "fp16", "fp8")
# The plain floating formats also by torch's dtype (or its name, as the CLI's --dtype takes it).
_BY_TORCH_DTYPE = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _check_precision(dtype) -> str:
    """The precision name for ``dtype``: a name ("bf16"), a torch dtype or a dtype's name ("bfloat16")."""
    if isinstance(dtype, torch.dtype) and dtype in _BY_TORCH_DTYPE:
        return _BY_TORCH_DTYPE[dtype]
    if isinstance(dtype, str):
        if dtype in _PRECISIONS:
            return dtype
        by_name = {str(d).removeprefix("torch."): name for d, name in _BY_TORCH_DTYPE.items()}
        if dtype in by_name:
            return by_name[dtype]
    raise ValueError(f"dtype {dtype!r} cannot be validated: expected one of {', '.join(_PRECISIONS)}, or "
                     f"torch.float64, torch.float32, torch.bfloat16, torch.float16 (the dtype or its name)")


def _inputs(input_shape, inputs, seed: int) -> "list[torch.Tensor]":
    if (input_shape is None) == (inputs is None):
        raise ValueError("give exactly one of input_shape (e.g. (4, 16, 32)) or inputs (CPU tensors)")
    if isinstance(input_shape, (str, bytes)):
        raise TypeError(f"input_shape must be a shape such as (4, 16, 32), not a {type(input_shape).__name__} "
                        f"({input_shape!r})")
    if inputs is not None:
        tensors = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                got = f"a tensor on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"inputs must be CPU tensors, got {got}")
        return tensors
    try:
        entries = list(input_shape)
    except TypeError:
        raise ValueError(f"input_shape {input_shape!r} must be a shape such as (4, 16, 32), or a list of shapes") from None
    shapes = [entries] if entries and all(as_integer(s) is not None for s in entries) else entries
    checked = []
    for shape in shapes:
        try:
            sizes = [as_integer(s) for s in shape]
        except TypeError:
            sizes = [None]
        if not sizes or any(size is None or size <= 0 for size in sizes):
            raise ValueError(f"input_shape {shape!r} must be positive integers, e.g. (4, 16, 32)")
        checked.append(tuple(sizes))
    shapes = checked
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(tuple(shape), generator=generator) for shape in shapes]


class _PlacedModel:
    """One copy of the model on one device, driven by the C++ validator."""

    def __init__(self, model, device, dtype, round_through=None, copy_model=True):
        self.device, self.dtype = device, dtype
        self.module = _copy(model) if copy_model else model
        if round_through is not None:
            self.module.to(device=device, dtype=round_through)
        self.module.to(device=device, dtype=dtype)

    def run(self, inputs, weights_for):
        """Forward and, when ``weights_for`` (output shapes -> weight capsules) is given, backward
        of sum_i sum(output_i * weight_i); returns CPU capsules of outputs and gradients."""
        xs = [from_dlpack(c) for c in inputs]
        # Copies, always: a model that changes its input in place (x.sub_(0.5)) changed the caller's
        # tensor and the input of every later run (the reference's too), failing correct backends.
        xs = [x.to(self.device, self.dtype, copy=True) if x.is_floating_point() else x.to(self.device, copy=True)
              for x in xs]
        parameters = list(self.module.named_parameters())
        for _, p in parameters:
            p.grad = None
        # TorchScript's optimiser swaps in a specialised graph after profiling the first runs of
        # every copy, so runs would execute different code; the C++ side turns it off likewise.
        with torch.jit.optimized_execution(False):
            return self._run(xs, weights_for, parameters)

    def _run(self, xs, weights_for, parameters):
        # A forward-only run (the determinism repeat) keeps grad mode as the first run had it: under
        # no_grad some modules take another kernel (TransformerEncoderLayer's and
        # MultiheadAttention's fast path in eval mode) whose last bits differ from the first run's.
        outputs = flatten(self.module(*xs), skip_non_tensors=True)  # e.g. attention's None weights
        if weights_for is None:
            grads = []
        else:
            ws = [from_dlpack(c) for c in weights_for([list(o.shape) for o in outputs])]
            # A complex output's real and imaginary parts both weighted, as the C++ side weights them.
            terms = [(torch.view_as_real(o) * w.to(o.device, o.real.dtype).unsqueeze(-1)).sum() if o.is_complex()
                     else (o * w.to(o.device, o.dtype)).sum()
                     for o, w in zip(outputs, ws) if (o.is_floating_point() or o.is_complex()) and o.requires_grad]
            if terms:
                torch.stack(terms).sum().backward() if len(terms) > 1 else terms[0].backward()
            grads = [(n, to_dlpack(p.grad.detach().cpu().contiguous().clone()))
                     for n, p in parameters if p.requires_grad and p.grad is not None]
            for _, p in parameters:
                p.grad = None  # gradients are device memory too
        return [to_dlpack(o.detach().cpu().contiguous().clone()) for o in outputs], grads

    def save_and_reload(self):
        buffer = io.BytesIO()
        if isinstance(self.module, torch.jit.ScriptModule):
            torch.jit.save(self.module, buffer)
            buffer.seek(0)
            reloaded = torch.jit.load(buffer, map_location=self.device)
        else:
            torch.save(self.module.state_dict(), buffer)
            buffer.seek(0)
            reloaded = _copy(self.module)
            reloaded.load_state_dict(torch.load(buffer, map_location=self.device))
        return _PlacedModel(reloaded, self.device, self.dtype, copy_model=False)


def _copy(model):
    # A copy that owns its tensors, so the source is never moved or cast. Deep-copying a
    # TorchScript module clones its parameters with autograd recording, which makes them
    # non-leaves whose .grad never fills in; detaching in place makes them leaves again.
    try:
        duplicate = copy.deepcopy(model)
    except (MemoryError, torch.OutOfMemoryError):
        raise  # a copy too large for the memory: said as it is
    except Exception as error:  # an attribute that cannot be copied (a lock, a file): not the model's run
        raise TypeError(f"the model cannot be deep-copied, which validation needs (each backend runs a copy; "
                        f"the model itself is never modified): {error}") from error
    for p in duplicate.parameters():
        if not p.is_leaf:
            requires_grad = p.requires_grad
            p.detach_().requires_grad_(requires_grad)
    return duplicate
