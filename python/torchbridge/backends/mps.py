"""Apple GPUs through torch's MPS build."""

from .base import Backend


class MPSBackend(Backend):
    """Apple GPUs through torch's MPS build, described and measured by the C++ core."""

    backend_name = "mps"
