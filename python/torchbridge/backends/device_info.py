"""``DeviceInfo``: one device's description, built from the C++ core's DeviceInfo.

The documented fields come first, in their documented units (memory in GB as floats, dtypes as
names); the C++ core's richer description (exact bytes, features, CPU ISA, driver and runtime
versions) follows as further attributes. A value the backend cannot know is None, never a guess.
"""

import dataclasses
import json
import warnings

import torch

_GB = 1024**3


@dataclasses.dataclass(frozen=True)
class Features:
    """What the hardware computes natively (the C++ ``DeviceFeatures``)."""

    tf32: bool
    bf16: bool
    fp16: bool
    fp8: bool
    flash_attention: bool
    unified_memory: bool


@dataclasses.dataclass(frozen=True)
class CPUISA:
    """Instruction-set extensions of the host CPU that matter for reduced precision."""

    avx2: bool
    avx512f: bool
    avx512_bf16: bool
    amx_bf16: bool
    avx512_fp16: bool
    amx_fp16: bool
    arm_bf16: bool
    arm_fp16: bool


@dataclasses.dataclass(frozen=True)
class CPUDetails:
    """The host CPU, for the cpu backend."""

    model_name: str
    physical_cores: int
    logical_cores: int
    ram_bytes: int
    isa: CPUISA


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """One device, as ``Backend.get_device_info()`` describes it.

    Documented fields: ``name``, ``backend``, ``memory_total_gb``, ``memory_available_gb``
    (GB = 2**30 bytes, floats), ``compute_capability`` (NVIDIA: "major.minor", e.g. "9.0";
    other devices: their architecture name, e.g. "gfx942", "x86_64"), ``supported_dtypes``
    (dtype names the hardware computes, e.g. "float32", "bfloat16").

    Further fields: ``vendor``, ``index``, ``device_type`` (torch's device type), exact
    ``total_memory_bytes`` / ``free_memory_bytes``, ``architecture``, ``multiprocessor_count``,
    ``driver_version``, ``runtime_version``, ``features`` (:class:`Features`) and ``cpu``
    (:class:`CPUDetails`, the cpu backend only).

    ``print(info)`` gives a readable summary, ``info.to_dict()`` / ``info.to_json()`` the data
    for machines. ``info["name"]`` (the dict this method returned before) still works in this
    release with a DeprecationWarning.
    """

    name: "str | None"
    backend: str
    memory_total_gb: "float | None"
    memory_available_gb: "float | None"
    compute_capability: "str | None"
    supported_dtypes: "tuple[str, ...] | None"
    vendor: "str | None" = None
    index: int = 0
    device_type: "str | None" = None
    total_memory_bytes: "int | None" = None
    free_memory_bytes: "int | None" = None
    architecture: "str | None" = None
    multiprocessor_count: "int | None" = None
    driver_version: "str | None" = None
    runtime_version: "str | None" = None
    features: "Features | None" = None
    cpu: "CPUDetails | None" = None
    # The dict get_device_info() returned before this class, for the deprecated item access.
    _legacy: "dict | None" = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def from_core_json(cls, text: str, device_type: str) -> "DeviceInfo":
        """Built from the C++ DeviceInfo's JSON (``cli/json_report.cpp``, the same encoding the
        CLI prints) for a device of torch type ``device_type``."""
        raw = json.loads(text)
        total, free = raw["total_memory_bytes"], raw["free_memory_bytes"]
        cpu = raw["cpu"]
        legacy = _legacy_dict(raw, device_type)
        return cls(
            name=raw["name"], backend=raw["backend"],
            memory_total_gb=None if total is None else total / _GB,
            memory_available_gb=None if free is None else free / _GB,
            compute_capability=compute_capability(raw["architecture"]),
            supported_dtypes=tuple(raw["supported_dtypes"]),
            vendor=raw["vendor"], index=raw["index"], device_type=device_type,
            total_memory_bytes=total, free_memory_bytes=free, architecture=raw["architecture"],
            multiprocessor_count=raw["multiprocessor_count"], driver_version=raw["driver_version"],
            runtime_version=raw["runtime_version"], features=Features(**raw["features"]),
            cpu=None if cpu is None else CPUDetails(**{**cpu, "isa": CPUISA(**cpu["isa"])}),
            _legacy=legacy)

    # -- derived views ------------------------------------------------------------------------------
    @property
    def torch_dtypes(self) -> "list[torch.dtype] | None":
        """``supported_dtypes`` as torch dtypes."""
        if self.supported_dtypes is None:
            return None
        return [getattr(torch, n) for n in self.supported_dtypes if isinstance(getattr(torch, n, None), torch.dtype)]

    def to_dict(self) -> dict:
        """Every public field as plain JSON-ready values (nested dataclasses become dicts)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if not f.name.startswith("_")}

    def to_json(self, **json_options) -> str:
        return json.dumps(self.to_dict(), **json_options)

    def __str__(self) -> str:
        where = f"{self.device_type or self.backend}:{self.index}"
        lines = [f"{self.name or '(unnamed device)'} [{self.backend}, {where}]"]

        def row(label, value):
            lines.append(f"  {label:<20}{'unknown' if value is None else value}")

        row("vendor", self.vendor)
        row("memory", None if self.memory_total_gb is None else
            f"{_gb(self.memory_available_gb)} available of {_gb(self.memory_total_gb)}")
        row("compute capability", self.compute_capability)
        if self.architecture != self.compute_capability:
            row("architecture", self.architecture)
        row("multiprocessors", self.multiprocessor_count)
        row("driver", self.driver_version)
        row("runtime", self.runtime_version)
        row("dtypes", None if self.supported_dtypes is None else ", ".join(self.supported_dtypes))
        if self.features is not None:
            on = [f.name for f in dataclasses.fields(self.features) if getattr(self.features, f.name)]
            row("features", ", ".join(on) or "none")
        if self.cpu is not None:
            isa = [f.name for f in dataclasses.fields(self.cpu.isa) if getattr(self.cpu.isa, f.name)]
            row("cpu", f"{self.cpu.model_name}, {self.cpu.physical_cores} physical / "
                       f"{self.cpu.logical_cores} logical cores, {self.cpu.ram_bytes / _GB:.1f} GB RAM")
            row("cpu isa", ", ".join(isa) or "none of the tracked extensions")
        return "\n".join(lines)

    # -- the deprecated dict interface (one release) ------------------------------------------------
    def _legacy_view(self, how: str) -> dict:
        warnings.warn(
            f"DeviceInfo is a dataclass now; {how} is deprecated and will be removed in the next release: "
            "use attributes (info.name, info.memory_total_gb, ...) or info.to_dict()",
            DeprecationWarning, stacklevel=3)
        if self._legacy is None:
            raise TypeError(f"this DeviceInfo ({self.backend}) was not built from a dict; use its attributes")
        return self._legacy

    def __getitem__(self, key):
        legacy = self._legacy_view(f"info[{key!r}]")
        if key not in legacy:
            raise KeyError(f"{key!r}: DeviceInfo has no such key; keys: {', '.join(legacy)}")
        return legacy[key]

    def get(self, key, default=None):
        return self._legacy_view(f"info.get({key!r})").get(key, default)

    def keys(self):
        return self._legacy_view("info.keys()").keys()

    def items(self):
        return self._legacy_view("info.items()").items()

    def values(self):
        return self._legacy_view("info.values()").values()

    def __contains__(self, key) -> bool:
        return key in self._legacy_view(f"{key!r} in info")


def compute_capability(architecture: "str | None") -> "str | None":
    """NVIDIA's "major.minor" for an ``sm_XY`` architecture ("sm_90" -> "9.0", "sm_120" ->
    "12.0"); any other architecture name as it is."""
    major_minor = cuda_capability(architecture)
    return architecture if major_minor is None else f"{major_minor[0]}.{major_minor[1]}"


def cuda_capability(architecture: "str | None") -> "tuple[int, int] | None":
    """(major, minor) of an NVIDIA ``sm_XY`` architecture; None for anything else."""
    if architecture and architecture.startswith("sm_") and architecture[3:].isdigit() and len(architecture) > 4:
        return int(architecture[3:-1]), int(architecture[-1])
    return None


def _legacy_dict(raw: dict, device_type: str) -> dict:
    """Exactly the dict get_device_info() returned before DeviceInfo existed."""
    info = dict(raw)
    total, free = raw["total_memory_bytes"], raw["free_memory_bytes"]
    info["memory_total_gb"] = None if total is None else total / _GB
    info["memory_available_gb"] = None if free is None else free / _GB
    info["compute_capability"] = raw["architecture"]
    info["device_type"] = device_type
    info["supported_dtype_names"] = list(raw["supported_dtypes"])
    info["supported_dtypes"] = [getattr(torch, n) for n in raw["supported_dtypes"] if hasattr(torch, n)]
    return info


def _plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return list(value)
    return value


def _gb(value: "float | None") -> str:
    return "unknown" if value is None else f"{value:.2f} GB"
