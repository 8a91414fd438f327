"""The host CPU."""

from .base import Backend


class CPUBackend(Backend):
    """The host CPU, described and measured by the C++ core."""

    backend_name = "cpu"
