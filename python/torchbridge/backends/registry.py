"""Which Python class serves which backend name."""

from .amd import AMDBackend
from .base import Backend
from .cpu import CPUBackend
from .intel import IntelBackend
from .mps import MPSBackend
from .nvidia import NVIDIABackend
from .tpu import TPUBackend

_CLASSES = {
    "cuda": NVIDIABackend,
    "rocm": AMDBackend,
    "xpu": IntelBackend,
    "mps": MPSBackend,
    "cpu": CPUBackend,
    "tpu": TPUBackend,
}
_PYTHON_ONLY = {"tpu", "xla"}


def is_python_only(name: str) -> bool:
    return name.lower() in _PYTHON_ONLY


def backend_class(canonical_name: str) -> type:
    """The vendor class for a canonical name; the generic Backend for PrivateUse1 devices."""
    if is_python_only(canonical_name):
        return TPUBackend
    return _CLASSES.get(canonical_name, Backend)
