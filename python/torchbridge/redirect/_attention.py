"""torch.nn.attention.sdpa_kernel under redirection to the CPU. CUDA code picks attention kernels
for speed: sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION) or CUDNN_ATTENTION names kernels only CUDA
has, and with the CPU's own two (flash and math) switched off, scaled_dot_product_attention fails
with "No viable backend". The CPU's math kernel computes the same attention, so a choice that names
none of the CPU's kernels gets it added, with a warning once. (An SDK device runs attention through
its own path, which the choice does not restrict.)"""

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
