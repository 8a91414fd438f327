"""torch.nn.attention.sdpa_kernel under redirection to the CPU. CUDA code picks attention kernels
for speed: sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION) or CUDNN_ATTENTION names kernels only CUDA
has, and with the CPU's own two (flash and math) switched off, scaled_dot_product_attention fails
with "No viable backend". The CPU's math kernel computes the same attention, so a choice that names
none of the CPU's kernels gets it added, with a warning once; so do torch.backends.cuda's global
switches. (An SDK device runs attention through its own path, which the choice does not restrict.)"""

import functools

from ._redirector import logger


def install(patcher):
    import torch.nn.attention as attention
    from torch.nn.attention import SDPBackend

    cpu_kernels = {SDPBackend.FLASH_ATTENTION, SDPBackend.MATH}
    original = attention.sdpa_kernel
    warned = []

    @functools.wraps(original)
    def sdpa_kernel(backends, set_priority=False):
        listed = [backends] if isinstance(backends, SDPBackend) else backends
        if isinstance(listed, list) and listed and all(isinstance(b, SDPBackend) for b in listed) \
                and not cpu_kernels.intersection(listed):
            if not warned:
                warned.append(True)
                logger.warning("sdpa_kernel(%s): the CPU has none of these kernels; its math kernel computes the "
                               "same attention and runs it", ", ".join(b.name for b in listed))
            backends = [*listed, SDPBackend.MATH]
        return original(backends, set_priority)

    patcher.replace(attention, "sdpa_kernel", sdpa_kernel)
    _install_global_switches(patcher)


def _install_global_switches(patcher):
    """The same choice made with torch.backends.cuda's global switches (enable_flash_sdp(False) and
    enable_math_sdp(False), leaving CUDA's memory-efficient kernel): the math kernel stays on."""
    import torch.backends.cuda as switches

    enable_math = switches.enable_math_sdp
    warned = []

    def keeping_a_cpu_kernel(original):
        @functools.wraps(original)
        def switch(enabled):
            original(enabled)
            if not switches.flash_sdp_enabled() and not switches.math_sdp_enabled():
                if not warned:
                    warned.append(True)
                    logger.warning("%s(%s) leaves none of the CPU's attention kernels on; its math kernel "
                                   "computes the same attention and stays on", original.__name__, enabled)
                enable_math(True)

        return switch

    for name in ("enable_flash_sdp", "enable_math_sdp"):
        patcher.replace(switches, name, keeping_a_cpu_kernel(getattr(switches, name)))
