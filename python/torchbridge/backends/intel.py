"""Intel GPUs through torch's XPU build."""

from .base import Backend


class IntelBackend(Backend):
    """Intel GPUs through torch's XPU build, described and measured by the C++ core."""

    backend_name = "xpu"
