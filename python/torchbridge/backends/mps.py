"""Apple GPUs through torch's MPS build."""

from .base import VendorBackend


class MPSBackend(VendorBackend):
    """Apple GPUs through torch's MPS build, described and measured by the C++ core."""

    backend_name = "mps"
