"""Loading TorchBridge SDK devices (e.g. the emulated accelerator ``emu``) into this process."""

import atexit
import contextlib
import functools
import json
import os
import sys
import types
import warnings

import torch

from . import _C, _device_queries, _device_streams, _inductor_refusal, _parallel_comm

#: Environment variable naming an SDK device to load when torchbridge is imported, for programs
#: that cannot be edited.
LOAD_ENV_VAR = "TORCHBRIDGE_LOAD_DEVICE"


def load(name: str) -> None:
    """Registers SDK device ``name`` as PyTorch's PrivateUse1 device.

    Afterwards ``torch.randn(2, device=name)``, ``torch.accelerator.*`` and
    ``torch.accelerator.memory_*`` work, and ``torch.<name>`` is the device's module. Loading the
    device that is already loaded does nothing; loading a second one raises, since PyTorch has a
    single PrivateUse1 slot.
    """
    first_time = _C.registered_device() != name
    if first_time:
        _refuse_a_name_torch_has(name)
    _C.load_device(name)  # refuses, saying why, when this process already used CUDA (or another)
    _integrate_with_torch(name)
    if first_time:
        _warn_about_native_accelerators(name)


def _drain_autograd_at_exit() -> None:
    """Before the interpreter finalizes, waits for autograd's threads for the SDK device to release
    the last backward pass: one released during finalization aborts the process (a torch race,
    explained in python/src/autograd_exit.cpp). Registered at import, since a device can be loaded
    from C++ as well (``BackendFactory.create``, redirection); without one it does nothing."""
    try:
        _C.drain_autograd_device_threads()
    except torch.OutOfMemoryError:
        # No room for the probe's 4 bytes: the device is full, and the program has (almost always)
        # just said so itself. A second out-of-memory line after that one became the last line of
        # stderr, the one a parent process (portability's child checks) reports.
        pass
    except Exception as error:  # the program is ending: say so, without changing its exit status
        sys.stderr.write(f"torchbridge: could not wait for autograd's device threads at exit: {error}\n")


atexit.register(_drain_autograd_at_exit)  # after torch's own exit handlers were registered: runs before them


#: Native accelerators of torch, by backend name, that an SDK device takes autograd away from.
_NATIVE_ACCELERATORS = ("cuda", "rocm", "xpu", "mps")


def _warn_about_native_accelerators(name: str) -> None:
    """PyTorch's autograd serves one accelerator per process: once ``name`` is registered, a
    backward pass on an available native accelerator would fail inside PyTorch. Loading is allowed
    (the program may never use that accelerator), but never silently."""
    available = [n for n in _NATIVE_ACCELERATORS if _C.lookup(n).availability()[0] == "available"]
    if available:
        warnings.warn(
            f"SDK device '{name}' is now PyTorch's accelerator for autograd in this process; "
            f"{', '.join(available)} is available here, but TorchBridge refuses it from now on and a backward "
            f"pass on it through torch directly would fail inside PyTorch (one accelerator per process; "
            f"docs/device-sdk.md). Use {available[0]} in another process.",
            RuntimeWarning, stacklevel=3)


def loaded() -> "str | None":
    """Name of the SDK device loaded in this process, if any."""
    return _C.registered_device()


def available() -> "list[str]":
    """Names of the SDK device libraries TorchBridge can find."""
    return list(_C.available_devices())


def fallback_counts() -> "dict[str, int]":
    """How often each operator ran on the SDK device's CPU fallback since the last reset."""
    return dict(_C.fallback_counts())


def reset_fallback_counts() -> None:
    _C.reset_fallback_counts()


@contextlib.contextmanager
def _torch_own_device_type():
    """torch's own ``torch.device`` for the block. torch resolves a device module's name through
    ``torch.device``; under redirection that may be replaced, and with the target ``cpu`` the name
    ``emu`` would resolve to ``cpu`` (a program loading emu under ``torchbridge run`` failed)."""
    current = torch.device
    torch.device = torch._C.device
    try:
        yield
    finally:
        torch.device = current


def _refuse_a_name_torch_has(name) -> None:
    """A device is ``torch.<name>``: a name torch already has (``linalg``, ``nn``, ``random``) left
    torch's own there, so the device had no module (no memory statistics, and torch.manual_seed no
    longer seeded it) while loading seemed to succeed."""
    existing = getattr(torch, name, None) if isinstance(name, str) else None
    if existing is not None and not getattr(existing, "_torchbridge_device", False):
        raise ValueError(f"device name '{name}' is taken: torch.{name} is torch's own "
                         f"{type(existing).__name__}, and a PrivateUse1 device's module must be torch.{name}; "
                         "choose another name for the device")


def _integrate_with_torch(name: str) -> None:
    if torch._C._get_privateuse1_backend_name() != name:
        torch.utils.rename_privateuse1_backend(name)
    _refuse_a_name_torch_has(name)  # loaded from C++ (BackendFactory.create) before Python saw it
    if not hasattr(torch, name):
        with _torch_own_device_type():
            torch._register_device_module(name, _device_module(name))
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
            )
        _inductor_refusal.install(name)
        _parallel_comm.install_for_sdk_device(name, getattr(torch, name))
        _byteswap_through_the_host(name)


def _byteswap_through_the_host(name: str) -> None:
    """torch's UntypedStorage.byteswap swaps the bytes in place through the storage's pointer, which
    for device memory is no host memory: on emu it killed the process (SIGSEGV), and torch.load
    calls it for a big-endian file loaded onto the device. The device's bytes go through the host."""
    swap_in_place = torch.UntypedStorage.byteswap

    def byteswap(self, dtype):
        if self.device.type != name:
            return swap_in_place(self, dtype)
        host = self.cpu()
        swap_in_place(host, dtype)
        self.copy_(host)

    torch.UntypedStorage.byteswap = functools.wraps(swap_in_place)(byteswap)


def _device_module(name: str) -> types.ModuleType:
    """The ``torch.<name>`` module PyTorch expects of a PrivateUse1 device (seeding, RNG state,
    device selection), answered by the C++ core."""
    module = types.ModuleType(f"torch.{name}")
    module._torchbridge_device = True  # ours, not a torch attribute of the same name

    def device_count() -> int:
        return _C.lookup(name).device_count()

    def current_device() -> int:
        return _C.privateuse1_current_device()

    def index(device=None) -> int:
        if device is None:
            return current_device()
        if isinstance(device, int):
            return device
        device = torch.device(device)  # under redirection, "cuda" names this device
        if device.type != name:
            # torch.emu.memory_allocated("cpu") answered for the current emu device.
            raise ValueError(f"torch.{name}: {str(device)!r} is not a {name!r} device: expected "
                             f"'{name}', '{name}:N', an index or None")
        return device.index if device.index is not None else current_device()

    def seed_bits(seed) -> int:
        """A seed as torch's generators take it: any integer in [-2**63, 2**64), negative ones as
        their 64-bit two's complement (torch.manual_seed(-1) seeds 2**64 - 1)."""
        seed = int(seed)
        if not -2**63 <= seed < 2**64:
            raise RuntimeError(f"manual_seed: {seed} is out of range: expected an integer in [-2**63, 2**64)")
        return seed & (2**64 - 1)

    def manual_seed(seed: int) -> None:
        _C.generator_manual_seed(name, current_device(), seed_bits(seed))

    def manual_seed_all(seed: int) -> None:
        for i in range(device_count()):
            _C.generator_manual_seed(name, i, seed_bits(seed))

    def seed() -> None:
        _C.generator_seed(name, current_device())

    def seed_all() -> None:
        for i in range(device_count()):
            _C.generator_seed(name, i)

    def initial_seed() -> int:
        return _C.generator_initial_seed(name, current_device())

    def get_rng_state(device=None) -> torch.Tensor:
        state = _C.generator_get_state(name, index(device))
        return torch.frombuffer(bytearray(state), dtype=torch.uint8)

    def set_rng_state(new_state: torch.Tensor, device=None) -> None:
        # As torch.set_rng_state and torch.cuda's: a state of another dtype was cast to bytes, each
        # value wrapping modulo 256, and taken as a different state without a word.
        if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
            got = new_state.dtype if isinstance(new_state, torch.Tensor) else type(new_state).__name__
            raise TypeError(f"RNG state must be a torch.ByteTensor (dtype torch.uint8), as get_rng_state() "
                            f"returns, got {got}")
        _C.generator_set_state(name, index(device), bytes(new_state.detach().cpu().contiguous().numpy()))

    def get_rng_state_all():
        return [get_rng_state(i) for i in range(device_count())]

    def set_rng_state_all(states) -> None:
        for i, state in enumerate(states):
            set_rng_state(state, i)

    class device:
        """Context manager that makes a device current and restores the previous one."""

        def __init__(self, device):
            self.index = -1 if device is None else index(device)
            self.previous = -1

        def __enter__(self):
            if self.index >= 0:
                self.previous = current_device()
                _C.privateuse1_set_device(self.index)
            return self

        def __exit__(self, *exc_info):
            if self.previous >= 0:
                _C.privateuse1_set_device(self.previous)
            return False

    module.device = device

    def get_amp_supported_dtype():
        """Autocast dtypes: the reduced-precision floats the device reports it computes in."""
        names = json.loads(_C.lookup(name).info_json(0))["supported_dtypes"]
        return [getattr(torch, n) for n in ("float16", "bfloat16") if n in names]

    module.get_amp_supported_dtype = get_amp_supported_dtype
    for function in (device_count, current_device, manual_seed, manual_seed_all, seed, seed_all, initial_seed,
                     get_rng_state, set_rng_state, get_rng_state_all, set_rng_state_all):
        setattr(module, function.__name__, function)
    module.is_available = lambda: device_count() > 0
    module.set_device = lambda device: _C.privateuse1_set_device(index(device))
    module.synchronize = lambda device=None: _C.lookup(name).synchronize(index(device))
    module._is_in_bad_fork = _C.in_bad_fork
    module.is_initialized = lambda: True
    # torch.utils.checkpoint saves and replays a device's random state only where its module says
    # `_initialized` (torch.cuda's flag); without it a checkpointed torch.rand on this device drew
    # other numbers when recomputed, and the gradients came out wrong.
    module._initialized = True
    _device_queries.add_queries(module, name, index)
    _device_streams.add_streams(module, name, index)
    return module


def _load_from_environment() -> None:
    requested = os.environ.get(LOAD_ENV_VAR, "").strip()
    if requested:
        try:
            load(requested)
        except (RuntimeError, ValueError) as error:
            # Raised while torchbridge is imported, far from where the variable was set: named here.
            raise type(error)(f"{LOAD_ENV_VAR}={requested!r} (loaded when torchbridge is imported): {error}; "
                              f"unset it or name a device library that loads") from None
