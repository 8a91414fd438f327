"""The precision policy: which precision a device computes in, decided by the C++ core from the
device's real capabilities (``include/torchbridge/precision_policy.h``), with the reason.

    decision = torchbridge.precision.decide("auto")          # on the best backend here
    print(decision.precision, decision.reason)
"""

import dataclasses
import json

from . import _C

__all__ = ["PrecisionCapability", "PrecisionDecision", "computes", "decide"]


@dataclasses.dataclass(frozen=True)
class PrecisionCapability:
    precision: str  # fp64, fp32, tf32, fp16, bf16, fp8
    support: str    # "native", "emulated" (torch computes it in software), "unavailable"
    reason: str


@dataclasses.dataclass(frozen=True)
class PrecisionDecision:
    requested: str   # "auto" or the name asked for
    precision: str   # what to compute in
    support: str     # "native" or "emulated"
    device: str      # what it was decided for, e.g. "cuda:0 (NVIDIA H100 80GB HBM3)"
    reason: str
    capabilities: "tuple[PrecisionCapability, ...]"

    def __str__(self) -> str:
        return f"{self.precision} on {self.device} ({self.support}): {self.reason}"

    @classmethod
    def from_json(cls, text: str) -> "PrecisionDecision":
        data = json.loads(text)
        data["capabilities"] = tuple(PrecisionCapability(**row) for row in data["capabilities"])
        return cls(**data)


def decide(requested: str = "auto", backend: "str | None" = None, device_index: int = 0) -> PrecisionDecision:
    """The precision for ``requested`` ("auto" or a precision name) on ``backend`` (None: the best
    backend here). A precision the device cannot compute raises ValueError naming the device and
    the precisions it supports."""
    if not isinstance(requested, str):
        raise TypeError(f"precision must be a str such as 'auto' or 'bf16', got {requested!r}")
    from .backends import BackendFactory

    native = BackendFactory.create(backend, device_index)
    if native.name == "tpu":  # the C++ core said only "backend 'tpu' is not available"
        native.precision_policy(requested, device_index)  # raises, saying why
    return PrecisionDecision.from_json(_C.decide_precision(native.name, device_index, requested))


def computes(precision: str, backend: str, device_index: int = 0, including_emulation: bool = True) -> bool:
    """Whether ``backend``'s device computes ``precision`` (fp64, fp32, tf32, fp16, bf16, fp8): in
    hardware, or also in software where ``including_emulation`` (the ``support`` column of the
    precision table: float16/bfloat16 on CPUs without vector units for them and on NVIDIA and AMD
    GPUs without tensor cores for them are "emulated"; ``torch.cuda.is_bf16_supported`` asks the
    same question of CUDA and, like this, counts emulation by default)."""
    # Through the Python backend first, as decide() does: it loads an SDK device into torch too
    # (the C++ call alone left "emu" registered but without torch.emu). Deciding fp32, which every
    # backend computes, returns the table of every precision.
    if not isinstance(including_emulation, bool):  # "False" is true
        raise TypeError(f"including_emulation must be a bool, got {including_emulation!r}")
    from .backends import BackendFactory

    native = BackendFactory.create(backend, device_index)
    table = PrecisionDecision.from_json(_C.decide_precision(native.name, device_index, "fp32")).capabilities
    support = next((row.support for row in table if row.precision == precision), None)
    if support is None:
        raise ValueError(f"precision must be one of {', '.join(row.precision for row in table)}, got {precision!r}")
    return support == "native" or (including_emulation and support == "emulated")
