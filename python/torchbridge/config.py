"""TorchBridgeConfig: how a program wants to run, in one object.

The fields, their defaults, the presets, file reading (JSON and TOML) and environment overrides
are the C++ core's (``include/torchbridge/optimize/config.h``): this dataclass crosses to C++ as
JSON for every check, so Python and C++ accept exactly the same documents.

    config = TorchBridgeConfig.for_training()      # also for_inference(), for_development()
    config = TorchBridgeConfig.from_file("run.toml", base=TorchBridgeConfig.for_inference())
    config = config.with_environment()             # TORCHBRIDGE_PRECISION=bf16 ... override fields
"""

import dataclasses
import json
import os

from . import _C
from .core.config import HardwareConfig, StrictFields

__all__ = ["TorchBridgeConfig", "config_fields"]


@dataclasses.dataclass
class TorchBridgeConfig(StrictFields):
    """Backend, precision and optimization level for UnifiedManager (docs/optimization.md).

    backend: a backend name or alias (cuda, nvidia, rocm, cpu, emu, ...) or "auto".
    device_index: which device of the backend.
    precision: "auto" (the fastest precision the hardware accelerates) or fp64, fp32, tf32, bf16,
        fp16, fp8; asking for one the device cannot compute raises, never a silent downgrade.
    optimization_level: "O0" place only, "O1" precision-neutral rewrites, "O2" + mixed precision
        and torch.compile, "O3" + FP8 and inference transforms.
    training: True keeps float32 master weights under autocast; False allows casting and
        quantizing weights.
    compile: at O2 and up, torch.compile the model.
    deterministic: deterministic algorithms only, and no timing-based kernel choice.
    validation: optimize() given example inputs compares the optimized model's outputs with the
        original model's in float64 on the CPU, under the precision's output bound; outside it
        raises.
    activation_checkpointing: training recomputes each block's activations in backward instead of
        keeping them: the blocks of the model's first nn.Sequential or nn.ModuleList of two or
        more run through torchbridge.memory.checkpoint (torch.compile is then not applied).
    hardware: vendor sections, ``hardware.nvidia`` / ``.amd`` / ``.intel`` / ``.tpu``
        (torchbridge.core.config): each field works on its vendor's hardware or is refused, and is
        reported in ``manager.report()`` where it cannot do anything.

    Setting a field that does not exist (``config.precison = ...``) raises naming the closest one;
    a value of the wrong type raises naming the field and its type.
    """

    backend: str = "auto"
    device_index: int = 0
    precision: str = "auto"
    optimization_level: str = "O2"
    training: bool = True
    compile: bool = True
    deterministic: bool = False
    validation: bool = False
    activation_checkpointing: bool = False
    hardware: HardwareConfig = dataclasses.field(default_factory=HardwareConfig)

    @classmethod
    def for_training(cls) -> "TorchBridgeConfig":
        """Automatic precision, O2 (mixed precision, compiled), float32 master weights."""
        return cls._from_json(_C.config_preset("training"))

    @classmethod
    def for_inference(cls) -> "TorchBridgeConfig":
        """Automatic precision, O3 (adds FP8 where supported and inference-only weight transforms)."""
        return cls._from_json(_C.config_preset("inference"))

    @classmethod
    def for_development(cls) -> "TorchBridgeConfig":
        """fp32, O0, deterministic, validated, nothing compiled: results comparable run to run."""
        return cls._from_json(_C.config_preset("development"))

    @classmethod
    def from_file(cls, path, base: "TorchBridgeConfig | None" = None) -> "TorchBridgeConfig":
        """A .json or .toml file; fields it does not name keep ``base``'s values (default: the
        dataclass defaults). Unknown keys, wrong types and bad values raise ValueError naming the
        file and the key."""
        base = cls() if base is None else base
        return cls._from_json(_C.config_load(os.fspath(path), base.to_json()))

    @classmethod
    def from_dict(cls, values: dict, base: "TorchBridgeConfig | None" = None) -> "TorchBridgeConfig":
        """Like from_file, for a dict (e.g. part of a larger configuration); sections may be nested
        dicts ({"hardware": {"nvidia": {...}}}) or dotted keys ("hardware.nvidia.fp8_enabled")."""
        if not isinstance(values, dict):
            raise TypeError(f"from_dict needs a dict of configuration fields, got {type(values).__name__}")
        merged = _merged(json.loads((cls() if base is None else base).to_json()), _nested(values))
        return cls._from_json(_C.config_check(json.dumps(merged), "dict"))

    def with_environment(self) -> "TorchBridgeConfig":
        """A copy with every field whose environment variable is set replaced by its value
        (``config_fields()`` lists the variables: TORCHBRIDGE_BACKEND, TORCHBRIDGE_PRECISION, ...)."""
        return self._from_json(_C.config_with_environment(self.to_json()))

    def validate(self) -> "TorchBridgeConfig":
        """Raises ValueError naming the first bad field (TypeError for a wrong Python type); returns self."""
        _C.config_check(self.to_json(), "TorchBridgeConfig")
        return self

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def _from_json(cls, text: str) -> "TorchBridgeConfig":
        return cls._from_plain(json.loads(text))


def _nested(values: dict) -> dict:
    """``values`` with dotted keys ("hardware.nvidia.fp8_enabled") as nested sections, so they lay
    over the base like nested ones (merged into the nested base, they read as given twice). A field
    given both ways in ``values`` itself is refused, naming it."""
    leaves: dict = {}

    def flatten(section: dict, prefix: tuple) -> None:
        for key, value in section.items():
            path = prefix + tuple(str(key).split("."))
            if isinstance(value, dict):
                flatten(value, path)
            elif path in leaves:
                raise ValueError(f"dict: '{'.'.join(path)}' is given twice (once as a dotted key, once inside its "
                                 "section)")
            else:
                leaves[path] = value

    flatten(values, ())
    result: dict = {}
    for path, value in leaves.items():
        section = result
        for depth, part in enumerate(path[:-1]):
            section = section.setdefault(part, {})
            if not isinstance(section, dict):
                raise ValueError(f"dict: '{'.'.join(path[:depth + 1])}' is both a field and a section")
        if isinstance(section.get(path[-1]), dict):
            raise ValueError(f"dict: '{'.'.join(path)}' is both a field and a section")
        section[path[-1]] = value
    return result


def _merged(base: dict, overrides: dict) -> dict:
    """`base` with `overrides` laid over it, section by section (unknown keys are kept, for the
    C++ reader to refuse by name)."""
    result = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _merged(result[key], value)
        else:
            result[key] = value
    return result


def config_fields() -> "list[dict]":
    """Every field: name, type, the environment variable that overrides it, and what it does."""
    return [dict(name=n, type=t, environment=e, description=d) for n, t, e, d in _C.config_schema()]
