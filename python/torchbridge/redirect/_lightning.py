"""Lightning's Trainer(accelerator="gpu") / Fabric(accelerator="cuda") under redirection. Their
CUDAAccelerator is torch.cuda all through (device counts, set_device, memory statistics, the
matmul-precision hint), which redirection answers, except for one check of its own: setup_device
refuses a device whose type is not "cuda". The target's device is shown to it as the CUDA device
of the same index, which the torch.cuda calls behind it send back to the target.

Lightning may be imported before or after redirection is enabled (usually after: `torchbridge run`
enables it before the program's first import), so the accelerator is patched where it is loaded
and, through a finder on sys.meta_path, when it is imported later."""

import sys

from .._after_import import when_imported
from ._redirector import _ORIGINAL_DEVICE

# Both distributions of Lightning: the unified package and the older standalone ones.
ACCELERATOR_MODULES = ("lightning.pytorch.accelerators.cuda", "lightning.fabric.accelerators.cuda",
                       "pytorch_lightning.accelerators.cuda", "lightning_fabric.accelerators.cuda")


def install(patcher, target_type):
    def patch(module):
        accelerator = getattr(module, "CUDAAccelerator", None)
        if accelerator is None or "setup_device" not in vars(accelerator):
            return
        original = accelerator.setup_device

        def setup_device(self, device):
            if device.type == target_type:
                device = _ORIGINAL_DEVICE("cuda", device.index)
            return original(self, device)

        patcher.replace(accelerator, "setup_device", setup_device)

    finder = when_imported(ACCELERATOR_MODULES, patch)
    patcher.defer(lambda: sys.meta_path.remove(finder) if finder in sys.meta_path else None)
