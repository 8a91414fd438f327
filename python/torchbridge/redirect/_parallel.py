"""torch.nn.DataParallel under redirection to a target other than CUDA (Hugging Face's Trainer
wraps every model in it when torch.cuda.device_count() > 1): torch.nn.parallel.comm's CUDA
collectives become copies between the target's devices (torchbridge/_parallel_comm.py), with
device indices meaning the target's devices and strings and torch.devices going through the
redirection policy."""

import torch
import torch.nn.parallel.comm

from .. import _parallel_comm


def install(patcher, redirector, device_type):
    collectives = _parallel_comm.collectives(device_type, torch.accelerator.current_device_index, redirector.resolve)
    for name, replacement in collectives.items():
        patcher.replace(torch.nn.parallel.comm, name, replacement)
    patcher.replace(_parallel_comm.DATA_PARALLEL_MODULE, "_check_balance",
                    _parallel_comm.balance_check(torch.cuda.get_device_properties))
