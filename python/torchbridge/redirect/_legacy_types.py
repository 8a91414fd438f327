"""The legacy typed constructors torch.cuda.FloatTensor, LongTensor, ... on the target. Older CUDA
programs pick one with `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor` and call
it (`Tensor(n, 1).fill_(1.0)`), check types with isinstance, and convert with
`x.type(torch.cuda.HalfTensor)` or `x.type("torch.cuda.HalfTensor")`. A build of torch without
CUDA refuses all three. Here the constructor is the CPU type's own (every argument form it takes),
moved to the target; isinstance asks for the dtype on the target's device type."""

import torch

# torch.cuda's legacy type names and their dtypes.
LEGACY_TYPES = {
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "CharTensor": torch.int8,
    "ShortTensor": torch.int16, "IntTensor": torch.int32, "LongTensor": torch.int64, "BoolTensor": torch.bool,
}


def install(patcher, target_device):
    """Replaces torch.cuda.<name>Tensor for the target device (a torch.device) and lets
    Tensor.type convert to them."""
    by_class = {}
    for name, dtype in LEGACY_TYPES.items():
        legacy_class = _legacy_class(name, dtype, getattr(torch, name), target_device)
        by_class[legacy_class] = dtype
        patcher.replace(torch.cuda, name, legacy_class)
    by_name = {f"torch.cuda.{name}": dtype for name, dtype in LEGACY_TYPES.items()}
    original_type = torch.Tensor.type

    def tensor_type(self, dtype=None, non_blocking=False, **kwargs):
        wanted = by_class.get(dtype) if isinstance(dtype, type) else by_name.get(dtype)
        if wanted is None:
            return original_type(self, dtype, non_blocking, **kwargs)
        return self.to(device=target_device, dtype=wanted, non_blocking=non_blocking)

    tensor_type.__doc__ = original_type.__doc__
    patcher.replace(torch.Tensor, "type", tensor_type)
    _install_default_tensor_type(patcher, target_device, by_class, by_name)


def _install_default_tensor_type(patcher, target_device, by_class, by_name):
    """torch.set_default_tensor_type(torch.cuda.FloatTensor), old tutorials' way to put every new
    tensor on the GPU: the dtype becomes the default and the target the default device, through
    torch.set_default_device (which holds for the calling thread; torch's legacy type was the
    process's). A CPU type given later takes that device back, as torch's CPU types make new
    tensors on the CPU, unless the program has set another default device since."""
    original = torch.set_default_tensor_type
    device_set_here = False

    def set_default_tensor_type(t):
        nonlocal device_set_here
        wanted = by_class.get(t) if isinstance(t, type) else by_name.get(t)
        if wanted is None:
            original(t)
            if device_set_here and torch.get_default_device().type == target_device.type:
                torch.set_default_device(None)
            device_set_here = False
            return
        if not wanted.is_floating_point:  # torch's own rule and message
            raise TypeError("only floating-point types are supported as the default type")
        torch.set_default_dtype(wanted)
        torch.set_default_device(target_device)
        device_set_here = True

    set_default_tensor_type.__doc__ = original.__doc__
    patcher.replace(torch, "set_default_tensor_type", set_default_tensor_type)


def _legacy_class(name, dtype, cpu_type, target_device):
    class Meta(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, torch.Tensor) and obj.dtype == dtype and obj.device.type == target_device.type

        def __call__(cls, *args, **kwargs):
            return cpu_type(*args, **kwargs).to(target_device)

    return Meta(name, (), {"__module__": "torch.cuda", "dtype": dtype, "is_cuda": True,
                           "__doc__": f"torch.cuda.{name} under redirection: {dtype} tensors on {target_device}"})
