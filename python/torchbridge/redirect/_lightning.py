"""Lightning's Trainer(accelerator="gpu") / Fabric(accelerator="cuda") under redirection. Their
CUDAAccelerator is torch.cuda all through (device counts, set_device, memory statistics, the
matmul-precision hint), which redirection answers, except for one check of its own: setup_device
refuses a device whose type is not "cuda". The target's device is shown to it as the CUDA device
of the same index, which the torch.cuda calls behind it send back to the target.

Lightning may be imported before or after redirection is enabled (usually after: `torchbridge run`
enables it before the program's first import), so the accelerator is patched where it is loaded
and, through a finder on sys.meta_path, when it is imported later."""

import os
import sys

import torch

from .._after_import import when_imported
from ._redirector import _ORIGINAL_DEVICE

# Both distributions of Lightning: the unified package and the older standalone ones.
ACCELERATOR_MODULES = ("lightning.pytorch.accelerators.cuda", "lightning.fabric.accelerators.cuda",
                       "pytorch_lightning.accelerators.cuda", "lightning_fabric.accelerators.cuda")


# Where Lightning builds the command that starts the other ranks of a multi-device run (DDP's
# default launcher) as `python SCRIPT ARGS`: without redirection there, the children trained on
# the CPU alone while the parent waited for them at the rendezvous (a hang).
LAUNCHER_MODULES = ("lightning.fabric.strategies.launchers.subprocess_script",
                    "lightning.pytorch.strategies.launchers.subprocess_script",
                    "lightning_fabric.strategies.launchers.subprocess_script",
                    "pytorch_lightning.strategies.launchers.subprocess_script")


# Where Lightning tells an out-of-memory error (its batch-size finder halves the batch on one) by
# the message text: "CUDA" and "out of memory". The target's allocator says "emu out of memory", so
# a program that recovers on a GPU died on the target.
MEMORY_MODULES = ("lightning.pytorch.utilities.memory", "pytorch_lightning.utilities.memory")


def _under_torchbridge_run(command, target, explicit):
    """`python SCRIPT ARGS` (or `python -m MODULE ARGS`) as `python -m torchbridge.cli run ...`, with
    the parent's explicit target in the environment when only the parent's code named it."""
    command = list(command)
    if not command or command[0] != sys.executable:
        return command
    started = [sys.executable, "-m", "torchbridge.cli", "run", *command[1:]]
    if explicit and os.environ.get("TORCHBRIDGE_BACKEND") != target:
        started = ["env", f"TORCHBRIDGE_BACKEND={target}", *started]
    return started


def install_launchers(patcher, target, explicit):
    def patch(module):
        for name in ("_basic_subprocess_cmd", "_hydra_subprocess_cmd"):
            original = getattr(module, name, None)
            # The pytorch launcher imports fabric's function by name: patched once, where it is bound.
            if original is None or getattr(original, "_torchbridge_launcher", False):
                continue
            if name == "_basic_subprocess_cmd":
                def replacement(*args, _original=original, **kwargs):
                    return _under_torchbridge_run(_original(*args, **kwargs), target, explicit)
            else:  # returns (command, working directory)
                def replacement(*args, _original=original, **kwargs):
                    command, cwd = _original(*args, **kwargs)
                    return _under_torchbridge_run(command, target, explicit), cwd
            replacement._torchbridge_launcher = True
            patcher.replace(module, name, replacement)

    finder = when_imported(LAUNCHER_MODULES, patch)
    patcher.defer(lambda: sys.meta_path.remove(finder) if finder in sys.meta_path else None)


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

    def recognise_out_of_memory(module):
        original = getattr(module, "is_cuda_out_of_memory", None)
        if original is None:
            return

        def is_cuda_out_of_memory(exception):  # looked up at call time by is_oom_error, in this module
            return isinstance(exception, torch.OutOfMemoryError) or original(exception)

        patcher.replace(module, "is_cuda_out_of_memory", is_cuda_out_of_memory)

    memory_finder = when_imported(MEMORY_MODULES, recognise_out_of_memory)
    patcher.defer(lambda: sys.meta_path.remove(memory_finder) if memory_finder in sys.meta_path else None)
