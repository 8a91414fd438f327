"""Lightning's Trainer(accelerator="gpu") / Fabric(accelerator="cuda") under redirection. Their
CUDAAccelerator is torch.cuda all through (device counts, set_device, memory statistics, the
matmul-precision hint), which redirection answers, except for one check of its own: setup_device
refuses a device whose type is not "cuda". The target's device is shown to it as the CUDA device
of the same index, which the torch.cuda calls behind it send back to the target.

Lightning may be imported before or after redirection is enabled (usually after: `torchbridge run`
enables it before the program's first import), so the accelerator is patched where it is loaded
and, through a finder on sys.meta_path, when it is imported later."""

import importlib.abc
import sys

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

    for name in ACCELERATOR_MODULES:
        if name in sys.modules:
            patch(sys.modules[name])
    finder = _PatchAfterImport(ACCELERATOR_MODULES, patch)
    sys.meta_path.insert(0, finder)
    patcher.defer(lambda: sys.meta_path.remove(finder) if finder in sys.meta_path else None)


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the named modules it asks the finders after it and wraps the
    loader they return, so that the module is patched right after it has been executed."""

    def __init__(self, names, patch):
        self.names, self.patch = frozenset(names), patch

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, self.patch)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ... of the real loader
        return getattr(self._loader, name)
