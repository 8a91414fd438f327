"""AMD GPUs through torch's ROCm build."""

from .base import VendorBackend


class AMDBackend(VendorBackend):
    """AMD GPUs through torch's ROCm build, described and measured by the C++ core."""

    backend_name = "rocm"
