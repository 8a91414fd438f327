"""FP8 training and inference for Linear layers: delayed per-tensor scaling, e4m3 forward and
e5m2 gradients, the recipe of Transformer Engine and torchao's float8 training.

``Fp8Linear`` computes with the same C++ code as ``torchbridge::amp::Fp8Linear``
(include/torchbridge/amp/fp8.h): ``torch._scaled_mm`` on devices with FP8 matrix units (NVIDIA
sm_89+; AMD MI300 takes other FP8 formats and emulates), the same numerics emulated (dequantize, float32 matmul) everywhere else, so
a model converted here trains the same on a CPU, on emu and on an H100 up to the matmul's
summation order::

    report = torchbridge.fp8.convert_to_fp8(model)
    print(report.summary())
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from . import _C
from ._module_swap import hooks_reason, replace_layers

__all__ = ["Fp8Linear", "Fp8ConversionReport", "checkpoint_contexts", "convert_to_fp8", "matmul_kernel"]

_E4M3 = torch.float8_e4m3fn
_E5M2 = torch.float8_e5m2


def matmul_kernel(device: "torch.device | str", kernel: str = "auto") -> str:
    """What an FP8 matmul on ``device`` runs: ``"scaled_mm"`` or ``"emulated"``."""
    _check_kernel_type(kernel)
    return _C._fp8_resolve_kernel(kernel, str(torch.device(device)))


# The C++ kernels write into tensors allocated here (tensor_address.h in the extension's sources
# explains why). Every tensor whose _cdata is passed is held by a name of this frame for the call.
def _quantize(values, fp8_format, amax_history, scale, margin):
    data = torch.empty(values.shape, dtype=_E4M3 if fp8_format == "e4m3" else _E5M2, device=values.device)
    scale_inverse = torch.empty((), dtype=torch.float32, device=values.device)
    _C._fp8_quantize(data._cdata, values._cdata, amax_history._cdata, scale._cdata, scale_inverse._cdata,
                     fp8_format, margin)
    return data, scale_inverse


def _matmul(a, a_scale_inverse, b, b_scale_inverse, out_dtype, kernel):
    out = torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
    _C._fp8_matmul(out._cdata, a._cdata, a_scale_inverse._cdata, b._cdata, b_scale_inverse._cdata, kernel)
    return out


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, layer, out_dtype, kernel):
        x, x_inverse = _quantize(input.reshape(-1, layer.in_features), "e4m3", layer.input_amax_history,
                                 layer.input_scale, layer.margin)
        w, w_inverse = _quantize(weight, "e4m3", layer.weight_amax_history, layer.weight_scale, layer.margin)
        w_t = w.t()
        output = _matmul(x, x_inverse, w_t, w_inverse, out_dtype, kernel)
        if bias is not None:
            output.add_(bias.to(out_dtype))
        ctx.save_for_backward(x, x_inverse, w, w_inverse)
        ctx.layer, ctx.kernel = layer, kernel
        ctx.input_shape, ctx.input_dtype, ctx.weight_dtype = input.shape, input.dtype, weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return output.reshape(*input.shape[:-1], layer.out_features)

    @staticmethod
    def backward(ctx, grad_output):
        x, x_inverse, w, w_inverse = ctx.saved_tensors
        layer = ctx.layer
        grad_2d = grad_output.reshape(-1, layer.out_features)
        g, g_inverse = _quantize(grad_2d, "e5m2", layer.grad_output_amax_history, layer.grad_output_scale,
                                 layer.margin)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = _matmul(g, g_inverse, w, w_inverse, ctx.input_dtype, ctx.kernel).reshape(ctx.input_shape)
        if ctx.needs_input_grad[1]:
            g_t = g.t()
            grad_weight = _matmul(g_t, g_inverse, x, x_inverse, ctx.weight_dtype, ctx.kernel)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_2d.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return grad_input, grad_weight, grad_bias, None, None, None


def checkpoint_contexts():
    """``context_fn`` for ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` around
    FP8 layers: the region's forward pass records the scales its layers used and its recomputation
    during backward quantizes with those and leaves the scaling state alone, as
    ``torchbridge.memory.checkpoint`` does by itself. Without it, torch's recomputation records each
    amax a second time and quantizes with the moved scale, so backward differentiates numbers the
    forward never computed::

        torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False,
                                          context_fn=torchbridge.fp8.checkpoint_contexts)

    Returns (forward context, recomputation context), new for each call, as torch expects.
    """
    return _C._recomputation_scopes()


def _warn_if_recomputed_without_record(layer) -> None:
    # A training forward inside a backward pass is a recomputation (torch.utils.checkpoint, either
    # kind); if no recorded region is being recomputed, the scales it uses are not the forward's.
    if (torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1 and not _C._recomputing()):
        warnings.warn(
            f"Fp8Linear({layer.in_features}, {layer.out_features}) ran during a backward pass outside a region "
            f"that records its scaling, presumably recomputed by torch.utils.checkpoint: the recomputation "
            f"updates the amax histories a second time and quantizes with the moved scales, so the gradients are "
            f"not those of the forward pass. Use torchbridge.memory.checkpoint, or pass "
            f"use_reentrant=False, context_fn=torchbridge.fp8.checkpoint_contexts to torch.utils.checkpoint",
            RuntimeWarning, stacklevel=4)


def _fp8_linear(input, weight, bias, layer, out_dtype, kernel):
    _warn_if_recomputed_without_record(layer)
    # Resolved here, inside the region torch.compile leaves alone: dynamo cannot trace the pybind
    # function and said so with a warning asking to "file an issue on GitHub" (once per process).
    resolved_kernel = matmul_kernel(input.device, kernel)
    return _Fp8LinearFunction.apply(input, weight, bias, layer, out_dtype, resolved_kernel)


# torch.compile must not trace into the layer: the C++ kernels take TensorImpl addresses, which
# under tracing would be fake tensors' (and dynamo would call the kernel while tracing). Compiled
# models run the FP8 layers eagerly, with graph breaks around them. torch.compiler.disable imports
# torch._dynamo (2 s of `import torchbridge` on the development VM), so the wrapper is made when
# the first layer is (built, converted or unpickled), not at import: no layer can run before then.
_fp8_linear_outside_compile: Optional[Callable] = None


def _make_fp8_linear_outside_compile() -> None:
    global _fp8_linear_outside_compile
    if _fp8_linear_outside_compile is None:
        _fp8_linear_outside_compile = torch.compiler.disable(_fp8_linear)


def _check_options(amax_history_length, margin, kernel) -> None:
    """The C++ checks of the ranges, after the types: a bool or a float reached the binding as
    pybind's "incompatible function arguments", or torch.zeros' complaint, naming no option."""
    for name, value in (("amax_history_length", amax_history_length), ("margin", margin)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"fp8 {name} must be an int, got {value!r}")
    _check_kernel_type(kernel)
    _C._fp8_check_options(amax_history_length, margin, kernel)


def _check_kernel_type(kernel) -> None:
    # Another type reached the binding as pybind's "incompatible function arguments".
    if not isinstance(kernel, str):
        raise TypeError(f"fp8 kernel must be a str ('auto', 'scaled_mm' or 'emulated'), got {kernel!r}")


_SCALED_OPERANDS = ("input", "weight", "grad_output")
_SCALING_STATE_BUFFERS = tuple(f"{operand}_{kind}" for operand in _SCALED_OPERANDS
                               for kind in ("amax_history", "scale"))


def _shapes_only_linear(input, weight, bias):
    """What Fp8Linear gives on the meta device (shape inference, init_empty_weights): a tensor of
    the output's shape and dtype, with autograd history to the parameters, and no FP8 state
    touched (there are no values to scale). Autocast has no meta device type, so the output has
    the input's dtype, as outside autocast; the parameters are cast to it because the layer takes
    any mix of input and parameter dtypes, which F.linear does not."""
    return nn.functional.linear(input, weight.to(input.dtype), None if bias is None else bias.to(input.dtype))


class Fp8Linear(nn.Module):
    """``nn.Linear`` computed in FP8: y = x W^T + b with x and W quantized e4m3, the output
    gradient e5m2, each with its own delayed scaling (the largest amax over the last
    ``amax_history_length`` steps, divided by 2^margin). Parameters keep their dtype (float32
    master weights); the output has the input's dtype, or the autocast dtype inside
    ``torch.autocast``. The scaling state is in float32 buffers, part of ``state_dict()``: it
    moves to the device of ``.to()``, ``.cuda()`` and the like, but keeps float32 through any
    dtype cast (``.half()``, ``.to(torch.bfloat16)``), as a scale such as 448 / amax overflows
    float16. On the meta device the layer computes only the output's shape and dtype.

    ``kernel``: ``"auto"`` (``torch._scaled_mm`` where the device has FP8 matrix units, the
    emulation elsewhere), ``"scaled_mm"`` or ``"emulated"``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, amax_history_length: int = 16,
                 margin: int = 0, kernel: str = "auto", device=None, dtype=None) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Fp8Linear: {name} must be a positive int, got {value!r}")
        _check_options(amax_history_length, margin, kernel)
        self.in_features, self.out_features = in_features, out_features
        self.amax_history_length, self.margin, self.kernel = amax_history_length, margin, kernel
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self._register_scaling_buffers(self.weight.device)
        self.reset_parameters()

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, amax_history_length: int = 16, margin: int = 0,
                    kernel: str = "auto") -> "Fp8Linear":
        """An Fp8Linear that takes over ``linear``'s parameters (the same Parameter objects, so an
        optimizer built over them keeps updating the model)."""
        if not isinstance(linear, nn.Linear):  # else an AttributeError on whichever attribute it lacked first
            raise TypeError(f"Fp8Linear.from_linear takes an nn.Linear, got {type(linear).__name__}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        _check_options(amax_history_length, margin, kernel)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.amax_history_length, layer.margin, layer.kernel = amax_history_length, margin, kernel
        layer.weight = linear.weight
        layer.bias = linear.bias
        layer._register_scaling_buffers(linear.weight.device)
        layer.train(linear.training)
        return layer

    def _register_scaling_buffers(self, device) -> None:
        _make_fp8_linear_outside_compile()  # every constructor passes here
        for operand in _SCALED_OPERANDS:
            self.register_buffer(f"{operand}_amax_history",
                                 torch.zeros(self.amax_history_length, dtype=torch.float32, device=device))
            self.register_buffer(f"{operand}_scale", torch.ones((), dtype=torch.float32, device=device))

    def _apply(self, fn, recurse=True):
        """``nn.Module._apply`` (under ``.to()``, ``.half()``, ``.cuda()``, ``to_empty()``...), but
        the scaling state keeps float32: cast to float16, a scale above 65504 became inf, its
        inverse 0, and the layer output zeros and zero weight gradients without an error."""
        state_before = {name: self._buffers[name] for name in _SCALING_STATE_BUFFERS}
        super()._apply(fn, recurse)
        for name, before in state_before.items():
            after = self._buffers[name]
            if after.dtype != torch.float32:  # a dtype cast: redo only its device move, from the float32 values
                self._buffers[name] = before.to(device=after.device)
        return self

    def __setstate__(self, state) -> None:  # unpickled or copied: made by no constructor
        _make_fp8_linear_outside_compile()
        super().__setstate__(state)

    def reset_parameters(self) -> None:
        # nn.Linear's initialisation, so swapping one for the other changes no statistics.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)
        self._reset_scaling_state()

    def _reset_scaling_state(self) -> None:
        # A layer built on the meta device and materialised with to_empty() (torch's deferred
        # initialisation, which then calls reset_parameters) had uninitialised memory as its amax
        # history; new weights make the old amaxes meaningless anyway.
        with torch.no_grad():
            for operand in _SCALED_OPERANDS:
                getattr(self, f"{operand}_amax_history").zero_()
                getattr(self, f"{operand}_scale").fill_(1.0)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() < 1 or input.shape[-1] != self.in_features:
            raise ValueError(f"Fp8Linear: the input's last dimension must be in_features = {self.in_features}, "
                             f"got input of shape {tuple(input.shape)}")
        if input.device != self.weight.device:
            raise ValueError(f"Fp8Linear: the input is on {input.device} but the layer is on {self.weight.device}; "
                             "move one of them")
        device_type = input.device.type
        if device_type == "meta":  # torch.is_autocast_enabled raises "unknown device type for autocast" for it
            return _shapes_only_linear(input, self.weight, self.bias)
        out_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else input.dtype
        return _fp8_linear_outside_compile(input, self.weight, self.bias, self, out_dtype, self.kernel)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"amax_history_length={self.amax_history_length}, margin={self.margin}, kernel={self.kernel!r}")


@dataclass(frozen=True)
class Fp8ConversionReport:
    """What ``convert_to_fp8`` did: ``converted`` holds (name, in_features, out_features),
    ``skipped`` holds (name, reason), ``aliases`` holds (name, converted name) for each further
    name a converted layer is registered under, which now holds the same ``Fp8Linear``;
    ``notes`` holds (name, note) for converted layers that do not always run, such as those
    torch's inference fast path of ``nn.TransformerEncoderLayer`` bypasses."""

    converted: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    aliases: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"fp8 conversion: {len(self.converted)} Linear layer(s) converted, {len(self.skipped)} skipped"]
        lines += [f"  converted {name} ({fan_in} -> {fan_out})" for name, fan_in, fan_out in self.converted]
        lines += [f"  {name} is {first}, converted with it" for name, first in self.aliases]
        lines += [f"  note on {name}: {note}" for name, note in self.notes]
        # The model itself has the empty name, as in named_modules().
        lines += [f"  skipped {name or '(the model)'}: {reason}" for name, reason in self.skipped]
        return "\n".join(lines)


def _skip_reason(parent: nn.Module, child: nn.Linear) -> Optional[str]:
    if isinstance(parent, nn.MultiheadAttention):
        return ("nn.MultiheadAttention reads its out_proj weight directly and never calls the layer, "
                "so converting it would change nothing")
    if type(child) is not nn.Linear:
        return f"{type(child).__name__} subclasses nn.Linear and may compute differently; convert it yourself"
    if child.in_features % 16 or child.out_features % 16:
        return (f"in_features {child.in_features} and out_features {child.out_features} must both be "
                "multiples of 16 for the FP8 matmul")
    return None


def _inference_bypass_note(parent: nn.Module, child: nn.Linear) -> Optional[str]:
    """Why a converted layer may not run, or None. nn.TransformerEncoderLayer's fast path (eval
    mode with autograd off, and its other conditions) reads linear1's and linear2's weights
    directly, like nn.MultiheadAttention's out_proj (see _skip_reason), but training calls them,
    so they are converted; the report says so, as it said "converted" while inference ran float32."""
    if isinstance(parent, nn.TransformerEncoderLayer) and (child is parent.linear1 or child is parent.linear2):
        return ("torch's inference fast path for nn.TransformerEncoderLayer (eval mode with autograd not recording, "
                "as under torch.no_grad) reads this layer's weight directly and never calls it, so inference there "
                "computes in the weight's dtype, not FP8; training runs it in FP8, and so does inference after "
                "torch.backends.mha.set_fastpath_enabled(False)")
    return None


def convert_to_fp8(model: nn.Module, *, amax_history_length: int = 16, margin: int = 0, kernel: str = "auto",
                   module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None) -> Fp8ConversionReport:
    """Replaces, in place, every ``nn.Linear`` of ``model`` whose in/out features are multiples of
    16 by an ``Fp8Linear`` sharing its parameters, and reports what it converted and what it left
    and why. A Linear registered under several names (two parents sharing it, or an alias) is
    decided once, at its first name, and the one ``Fp8Linear`` takes its place at all of them.
    ``module_filter_fn(module, qualified_name)`` returning False keeps a layer as it is (torchao's
    convention). ``model`` itself is never replaced, as a conversion in place cannot replace the
    object the caller holds: a bare Linear is reported skipped, under the empty name; convert
    ``nn.Sequential(layer)`` or use ``Fp8Linear.from_linear``."""
    if not isinstance(model, nn.Module):  # else an AttributeError on named_modules
        raise TypeError(f"convert_to_fp8 takes an nn.Module, got {type(model).__name__}")
    _check_options(amax_history_length, margin, kernel)
    report = Fp8ConversionReport()
    if isinstance(model, nn.Linear):
        # Reported rather than passed over: the report said "0 converted, 0 skipped", as if the
        # model held no Linear at all. Its children (a Linear subclass may hold some) still convert.
        kind = "nn.Linear" if type(model) is nn.Linear else f"nn.Linear ({type(model).__name__})"
        report.skipped.append(("", f"the model is itself an {kind}, which a conversion in place cannot replace "
                                   "(convert_to_fp8 replaces each layer in its parent module); convert "
                                   "nn.Sequential(model) instead, or use Fp8Linear.from_linear(model)"))

    def replacement_for(name, parent, child):
        if not isinstance(child, nn.Linear):
            return None
        reason = _skip_reason(parent, child) or hooks_reason(child)
        if reason is None and module_filter_fn is not None and not module_filter_fn(child, name):
            reason = "excluded by module_filter_fn"
        if reason is not None:
            report.skipped.append((name, reason))
            return None
        report.converted.append((name, child.in_features, child.out_features))
        note = _inference_bypass_note(parent, child)
        if note is not None:
            report.notes.append((name, note))
        return Fp8Linear.from_linear(child, amax_history_length=amax_history_length, margin=margin, kernel=kernel)

    report.aliases.extend(replace_layers(model, replacement_for))
    return report
