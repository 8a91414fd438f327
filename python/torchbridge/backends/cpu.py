"""The host CPU."""

from .base import VendorBackend


class CPUBackend(VendorBackend):
    """The host CPU, described and measured by the C++ core."""

    backend_name = "cpu"
