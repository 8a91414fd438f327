"""AMD GPUs through torch's ROCm build."""

from .base import Backend


class AMDBackend(Backend):
    """AMD GPUs through torch's ROCm build, described and measured by the C++ core."""

    backend_name = "rocm"
