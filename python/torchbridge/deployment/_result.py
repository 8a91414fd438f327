"""What an export returns, and the error raised when the written file does not reproduce the model."""

import dataclasses
import os


class ExportVerificationError(RuntimeError):
    """The exported file, loaded back, does not reproduce the model (the message says where and
    by how much)."""


@dataclasses.dataclass(frozen=True)
class ExportResult(os.PathLike):
    """The written file (``path``; the result itself is path-like), its ``format`` ("exported",
    "aoti", "torchscript", "onnx", "safetensors"), ``max_abs_error``: the largest absolute difference measured between
    the reloaded file and the model (0.0 when bit-identical), ``tolerance``: what the check
    allowed, as (rtol, atol), ``tied_weights``: for safetensors, each name stored only once
    (alias -> the name it is stored under), and for ONNX ``dynamic_batch``: whether the graph's
    batch dimension is symbolic, with ``verified_batch_sizes``: the batch sizes onnxruntime ran
    and matched the model at."""

    path: str
    format: str
    max_abs_error: float
    tolerance: "tuple[float, float]" = (0.0, 0.0)
    tied_weights: "dict[str, str]" = dataclasses.field(default_factory=dict)
    dynamic_batch: bool = False
    verified_batch_sizes: "tuple[int, ...]" = ()

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path
