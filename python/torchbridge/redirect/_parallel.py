"""torch.nn.DataParallel under redirection to a target other than CUDA (Hugging Face's Trainer
wraps every model in it when torch.cuda.device_count() > 1): torch.nn.parallel.comm's CUDA
collectives become copies between the target's devices (torchbridge/_parallel_comm.py), with
device indices meaning the target's devices and strings and torch.devices going through the
redirection policy."""

import types

import torch
import torch.nn.parallel.comm

from .. import _parallel_comm


def install(patcher, redirector, device_type):
    collectives = _parallel_comm.collectives(device_type, torch.accelerator.current_device_index, redirector.resolve)
    for name, replacement in collectives.items():
        patcher.replace(torch.nn.parallel.comm, name, replacement)
    patcher.replace(_parallel_comm.DATA_PARALLEL_MODULE, "_check_balance",
                    _parallel_comm.balance_check(_unreported_as_zero(torch.cuda.get_device_properties)))
    _install_device_ids(patcher, redirector)


def _unreported_as_zero(properties_of):
    """The redirected properties with an unreported (None) count as 0, which the balance check
    reads as "no count" and skips: it compares the counts with > 0, which None refuses."""

    def counts(device_id):
        properties = properties_of(device_id)
        return types.SimpleNamespace(total_memory=properties.total_memory or 0,
                                     multi_processor_count=properties.multi_processor_count or 0)

    return counts


def _install_device_ids(patcher, redirector):
    """DataParallel(model, device_ids=[0, 1]) written for two GPUs: each id means the device the
    redirection policy gives it (indices past the target's devices wrap, with its warning), and ids
    that come to name one device are that device once. On the CPU target, or with one device, the
    model then runs as it is; ids naming one device twice made torch's broadcast fail."""
    data_parallel = torch.nn.DataParallel
    original_init = data_parallel.__init__

    def target_index(device_id):
        device = redirector.resolve(device_id)
        return (device.index or 0) if isinstance(device, torch.device) else device

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        if device_ids is not None:
            device_ids = list(dict.fromkeys(target_index(d) for d in device_ids))
        if output_device is not None:
            output_device = target_index(output_device)
        original_init(self, module, device_ids, output_device, dim)

    patcher.replace(data_parallel, "__init__", __init__)
