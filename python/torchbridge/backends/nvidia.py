"""NVIDIA GPUs through torch's CUDA build."""

from .base import Backend


class NVIDIABackend(Backend):
    """NVIDIA GPUs through torch's CUDA build, described and measured by the C++ core."""

    backend_name = "cuda"
