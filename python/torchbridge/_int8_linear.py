"""Weight-only int8 Linear for CPU inference (optimization level O3, ``int8_weights`` step).

Weights are stored as int8 with one scale per output row; torch's ``_weight_int8pack_mm`` CPU
kernel multiplies bfloat16 activations by them without materialising a dequantised weight. With
bfloat16 activations it is faster than a bfloat16 matmul at small batch sizes (weights are read at
a quarter of float32's bytes); with float32 activations the kernel is much slower than float32
matmul, which is why the plan applies this only when the precision is bf16 (README benchmark).
"""

import torch

from ._module_swap import hooks_reason, replace_layers

_INT8_MAX = 127
# torch's CPU _weight_int8pack_mm handles in_features in multiples of 16 only. Otherwise, measured
# with torch 2.13 on the development VM, it killed the process (SIGSEGV at 17, 24, 60, 63, 100) or,
# from run to run, returned wrong numbers (relative error 7.0 at 40, 0.35 at 24, inf at 8).
_IN_FEATURES_MULTIPLE = 16


def unsupported_reason(linear: torch.nn.Linear) -> "str | None":
    """Why torch's int8 kernel cannot run this layer, or None when it can."""
    if linear.in_features % _IN_FEATURES_MULTIPLE:
        return (f"in_features {linear.in_features} is not a multiple of {_IN_FEATURES_MULTIPLE}, which torch's CPU "
                f"int8 kernel needs (it crashes or computes wrong numbers otherwise)")
    return None


class Int8WeightOnlyLinear(torch.nn.Module):
    """A Linear whose weight is int8 with a per-output-row scale; forward in ``compute_dtype``."""

    def __init__(self, linear: torch.nn.Linear, compute_dtype: torch.dtype):
        super().__init__()
        reason = unsupported_reason(linear)
        if reason is not None:
            raise ValueError(f"Int8WeightOnlyLinear: {reason}")
        weight = linear.weight.detach().float()
        # Symmetric per-row scale: the row's largest magnitude maps to 127 (an all-zero row keeps
        # scale 1 so it stays exactly zero instead of dividing by zero). Rounded to the compute
        # dtype first: the kernel multiplies by that scale, so the weights are quantized with it.
        scale = weight.abs().amax(dim=1) / _INT8_MAX
        scale = torch.where(scale > 0, scale, torch.ones_like(scale)).to(compute_dtype).float()
        quantized = torch.round(weight / scale[:, None]).clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.register_buffer("weight_int8", quantized.contiguous())
        self.register_buffer("scale", scale.to(compute_dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(compute_dtype))

    @property
    def weight(self) -> torch.Tensor:
        """The weight the layer computes with, dequantized (a new tensor each time, not a
        parameter): for code that reads a Linear's weight instead of calling it, as
        nn.TransformerEncoderLayer does to choose its fused path (AttributeError without it)."""
        return self.weight_int8.to(self.scale.dtype) * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leading = x.shape[:-1]
        flat = x.reshape(-1, self.in_features).to(self.scale.dtype)
        out = torch._weight_int8pack_mm(flat, self.weight_int8, self.scale)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*leading, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weight=int8, " \
               f"compute_dtype={self.scale.dtype}"


def skip_reason(linear: torch.nn.Linear) -> "str | None":
    """Why the int8 step leaves this Linear as it is (the kernel cannot run it, or a replacement
    would not run its hooks), or None when it converts it."""
    return unsupported_reason(linear) or hooks_reason(linear)


def quantize_linear_weights(model: torch.nn.Module,
                            compute_dtype: torch.dtype) -> "tuple[list[str], list[tuple[str, str]]]":
    """Replaces every nn.Linear of ``model`` the kernel can run, in place (one replacement at every
    name a layer is registered under); returns the qualified names replaced (each layer's first)
    and, for the others, (name, why not)."""
    replaced, skipped = [], []

    def replacement_for(name, parent, child):
        if type(child) is not torch.nn.Linear:  # subclasses may change forward: left alone
            return None
        reason = skip_reason(child)
        if reason is not None:
            skipped.append((name, reason))
            return None
        replaced.append(name)
        return Int8WeightOnlyLinear(child, compute_dtype)

    replace_layers(model, replacement_for)
    return replaced, skipped
