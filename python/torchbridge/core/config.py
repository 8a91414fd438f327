"""Vendor sections of the configuration: ``TorchBridgeConfig.hardware.nvidia`` / ``.amd`` /
``.intel`` / ``.tpu``, and the same classes for direct use::

    from torchbridge.core.config import AMDConfig, AMDArchitecture, IntelConfig, TPUConfig
    amd = AMDConfig(architecture=AMDArchitecture.CDNA3, enable_matrix_cores=True, memory_pool_size_gb=8.0)

Each field does what its name says on its vendor's hardware or is refused with the reason; on
other hardware a field set away from its default is reported (``manager.report()``,
``torchbridge info``), never silently ignored. The C++ core holds the schema
(include/torchbridge/optimize/hardware_config.h) and checks the values; these classes check
names and types as they are set, so a typo fails where it is made.
"""

import dataclasses
import difflib
import enum

__all__ = ["AMDArchitecture", "AMDConfig", "HardwareConfig", "IntelConfig", "NVIDIAConfig", "TPUConfig"]


class AMDArchitecture(str, enum.Enum):
    """AMD GPU families, checked against the GPU's gfx target (gfx90a is CDNA2, gfx942 CDNA3, ...)."""

    AUTO = "auto"
    CDNA1 = "CDNA1"
    CDNA2 = "CDNA2"
    CDNA3 = "CDNA3"
    CDNA4 = "CDNA4"
    RDNA2 = "RDNA2"
    RDNA3 = "RDNA3"
    RDNA4 = "RDNA4"

    def __str__(self) -> str:
        return self.value


def _closest(name: str, valid) -> str:
    match = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def _checked(owner: str, name: str, expected, value):
    """`value` as field `name` of type `expected` holds it, or TypeError naming both."""
    if isinstance(expected, type) and issubclass(expected, enum.Enum):
        if isinstance(value, expected):
            return value
        if isinstance(value, str):
            try:
                return expected(value)
            except ValueError:
                pass
        raise ValueError(f"{owner}.{name}: expected one of {', '.join(m.value for m in expected)}, got {value!r}")
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise TypeError(f"{owner}.{name}: expected {getattr(expected, '__name__', expected)}, "
                        f"got {type(value).__name__} {value!r}")
    return value


class StrictFields:
    """Dataclass mixin: setting or passing a field that does not exist raises naming the closest
    one, and a value of the wrong type raises naming the field and the type it takes."""

    def __new__(cls, *args, **kwargs):
        names = [f.name for f in dataclasses.fields(cls)]
        for key in kwargs:
            if key not in names:
                raise TypeError(f"{cls.__name__} has no field {key!r}{_closest(key, names)} "
                                f"Its fields: {', '.join(names)}")
        return super().__new__(cls)

    def __setattr__(self, name, value):
        types = {f.name: f.type for f in dataclasses.fields(self)}
        if name not in types:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}{_closest(name, types)} "
                                 f"Its fields: {', '.join(types)}")
        super().__setattr__(name, _checked(type(self).__name__, name, types[name], value))

    def to_dict(self) -> dict:
        result = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            result[f.name] = value.to_dict() if isinstance(value, StrictFields) else (
                value.value if isinstance(value, enum.Enum) else value)
        return result

    @classmethod
    def _from_plain(cls, values: dict):
        """From to_dict()'s output (nested sections as dicts)."""
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name in values:
                value = values[f.name]
                kwargs[f.name] = f.type._from_plain(value) if isinstance(f.type, type) and issubclass(
                    f.type, StrictFields) else value
        return cls(**kwargs)


@dataclasses.dataclass
class NVIDIAConfig(StrictFields):
    """fp8_enabled: O3 makes eligible Linear layers FP8 layers on sm_89+ GPUs, whatever the
    precision around them. flash_attention_version: "auto", "2" (torch's FlashAttention-2) or "3"
    (FlashAttention-3, sm_90, where torch has it registered). enable_oom_protection: a forward that
    runs out of memory frees the caching allocator's unused blocks and is retried once."""

    fp8_enabled: bool = False
    flash_attention_version: str = "auto"
    enable_oom_protection: bool = False


@dataclasses.dataclass
class AMDConfig(StrictFields):
    """architecture: checked against the GPU (a mismatch is an error). enable_matrix_cores=False:
    no reduced precision on the matrix cores (precision auto becomes fp32). memory_pool_size_gb > 0:
    the caching allocator is capped at that size."""

    architecture: AMDArchitecture = AMDArchitecture.AUTO
    enable_matrix_cores: bool = True
    memory_pool_size_gb: float = 0.0


@dataclasses.dataclass
class IntelConfig(StrictFields):
    """enable_ipex: run intel_extension_for_pytorch.optimize() on the model (reported as skipped
    when it is not installed). enable_onednn=False: torch's oneDNN CPU kernels off.
    enable_amx=False: refused on CPUs with AMX (oneDNN picks its ISA once per process; set
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 before starting)."""

    enable_ipex: bool = False
    enable_onednn: bool = True
    enable_amx: bool = True


@dataclasses.dataclass
class TPUConfig(StrictFields):
    """precision: "bfloat16" or "float32"; enable_xla_cache: torch_xla's persistent compilation
    cache; cache_max_size: only the default is accepted on TPUs (torch_xla's cache has no limit)."""

    precision: str = "bfloat16"
    enable_xla_cache: bool = False
    cache_max_size: int = 100


@dataclasses.dataclass
class HardwareConfig(StrictFields):
    nvidia: NVIDIAConfig = dataclasses.field(default_factory=NVIDIAConfig)
    amd: AMDConfig = dataclasses.field(default_factory=AMDConfig)
    intel: IntelConfig = dataclasses.field(default_factory=IntelConfig)
    tpu: TPUConfig = dataclasses.field(default_factory=TPUConfig)
