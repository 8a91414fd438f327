"""An SDK device warns exactly when the CPU does. Every OpInfo's first float32 samples run on emu
and on the CPU with warnings recorded; a warning only the device gives is noise the CPU-fallback
glue made (mse_loss and smooth_l1_loss warned on every call that a non-empty output was resized,
because torch's generated composite hands the CPU's .out kernel a result at its final shape), and
under `python -W error` it is an exception."""

import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

import torchbridge

SAMPLES_PER_OP = 4


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.detach().to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _warnings_of(op, sample, device):
    """The set of warning messages the call gives on `device`, or None if it raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            op.op(_to(sample.input, device), *_to(sample.args, device), **_to(sample.kwargs, device))
        except Exception:  # errors are the OpInfo sweep's business; this test compares warnings
            return None
    return {str(w.message) for w in caught}


def test_the_device_warns_only_where_the_cpu_does():
    torchbridge.devices.load("emu")
    compared, only_on_device = 0, {}
    for op in op_db:
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        for sample in list(op.sample_inputs("cpu", torch.float32))[:SAMPLES_PER_OP]:
            on_cpu, on_device = _warnings_of(op, sample, "cpu"), _warnings_of(op, sample, "emu")
            if on_cpu is None or on_device is None:
                continue
            compared += 1
            if on_device - on_cpu:
                only_on_device.setdefault(op.full_name, on_device - on_cpu)
    assert compared > 1500  # the samples really ran
    assert not only_on_device, only_on_device


def test_mse_and_smooth_l1_losses_train_silently_and_as_on_the_cpu():
    torchbridge.devices.load("emu")
    for loss in (torch.nn.functional.mse_loss, torch.nn.functional.smooth_l1_loss):
        for reduction in ("mean", "sum", "none"):
            x, y = torch.randn(6, 4), torch.randn(6, 4)
            on_device = x.to("emu").requires_grad_()
            on_cpu = x.clone().requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                device_loss = loss(on_device, y.to("emu"), reduction=reduction)
                device_loss.sum().backward()
            cpu_loss = loss(on_cpu, y, reduction=reduction)
            cpu_loss.sum().backward()
            assert torch.equal(device_loss.detach().cpu(), cpu_loss.detach())
            assert torch.equal(on_device.grad.cpu(), on_cpu.grad)
