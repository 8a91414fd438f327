"""Intel GPUs through torch's XPU build."""

from .base import VendorBackend


class IntelBackend(VendorBackend):
    """Intel GPUs through torch's XPU build, described and measured by the C++ core."""

    backend_name = "xpu"
