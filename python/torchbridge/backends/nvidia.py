"""NVIDIA GPUs through torch's CUDA build."""

from .base import VendorBackend


class NVIDIABackend(VendorBackend):
    """NVIDIA GPUs through torch's CUDA build, described and measured by the C++ core."""

    backend_name = "cuda"
