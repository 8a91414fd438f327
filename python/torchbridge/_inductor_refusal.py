"""torch.compile on an SDK device with its default backend. Inductor generates kernels only for
devices it has a code generator for (CPU, CUDA, XPU, MPS, ...) and has none for a PrivateUse1
device: it failed deep inside ("InductorError: KeyError: 'emu'", "Device emu not supported", a
LoweringException), depending on the graph. Once the device is loaded, inductor's entry point
refuses a graph whose inputs (parameters included) are on the device, saying why and what works."""

import functools

import torch

from ._after_import import when_imported

INDUCTOR_ENTRY_MODULE = "torch._inductor.compile_fx"


def refusal_message(device_name: str) -> str:
    return (f"torch.compile's default backend, inductor, has no code generator for SDK device '{device_name}' "
            "(it generates kernels for the devices it knows: CPU, CUDA, XPU, MPS, ...). Compile with "
            "torch.compile(model, backend='aot_eager'), which captures the graph and its autograd and runs the "
            f"device's own operators, or compile for the CPU and move the results to '{device_name}'")


def _on_device(value, device_name: str) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == device_name


def install(device_name: str) -> None:
    def patch(module):
        original = module.compile_fx
        if getattr(original, "_torchbridge_refuses", None) == device_name:
            return

        @functools.wraps(original)
        def compile_fx(model_, example_inputs_, *args, **kwargs):
            if any(_on_device(value, device_name) for value in example_inputs_ or ()):
                raise RuntimeError(refusal_message(device_name))
            return original(model_, example_inputs_, *args, **kwargs)

        compile_fx._torchbridge_refuses = device_name
        module.compile_fx = compile_fx

    when_imported([INDUCTOR_ENTRY_MODULE], patch)
