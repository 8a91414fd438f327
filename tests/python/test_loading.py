"""How SDK devices get loaded: explicitly, by environment variable, or by naming them."""

import pytest

from conftest import run_python


def test_environment_variable_loads_the_device_on_import():
    result = run_python("import torch, torchbridge; print(torchbridge.devices.loaded(), torch.randn(2, device='emu').device)",
                        env={"TORCHBRIDGE_LOAD_DEVICE": "emu"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["emu", "emu:0"]


def test_a_device_the_environment_variable_names_that_cannot_load_is_named_with_the_variable():
    # Raised on import, by every command of the console script: the error now says where it came from.
    result = run_python("import torchbridge", env={"TORCHBRIDGE_LOAD_DEVICE": "bogus"})
    assert result.returncode != 0
    assert ("TORCHBRIDGE_LOAD_DEVICE='bogus' (loaded when torchbridge is imported): no device library "
            "libtorchbridge_device_bogus.so") in result.stderr


def test_naming_the_device_in_the_factory_loads_it():
    result = run_python("import torch, torchbridge; b = torchbridge.BackendFactory.create('emu'); "
                        "print(b.device, b.get_device_info().name, torch.ones(1, device=b.device).device)")
    assert result.returncode == 0, result.stderr
    assert "emu:0 TorchBridge emulated accelerator emu:0" in result.stdout


def test_override_to_an_sdk_device_loads_it():
    result = run_python("import torchbridge; print(torchbridge.BackendFactory.create().name)",
                        env={"TORCHBRIDGE_BACKEND": "emu"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "emu"


@pytest.mark.parametrize("name,message", [("nosuchdevice", "no device library libtorchbridge_device_nosuchdevice.so"),
                                          ("../emu", "invalid device name")])
def test_bad_device_names(name, message):
    result = run_python(f"import torchbridge; torchbridge.devices.load({name!r})")
    assert result.returncode != 0
    assert message in result.stderr


def test_bad_device_options_are_reported():
    result = run_python("import torchbridge; torchbridge.devices.load('emu')", env={"TORCHBRIDGE_EMU_DEVICES": "0"})
    assert result.returncode != 0
    assert "TORCHBRIDGE_EMU_DEVICES" in result.stderr and "failed to start" in result.stderr


def test_a_device_library_whose_start_failed_is_not_started_again_in_the_process():
    # Its entry runs once per process (runtime.h), and the library stays loaded once it has run: a
    # refused load once unloaded it, which crashed a runtime whose own threads still ran its code.
    # A second load repeats the first answer rather than calling the entry again.
    result = run_python("""
import torchbridge
for attempt in range(2):
    try:
        torchbridge.devices.load("emu")
    except RuntimeError as error:
        print(error)
""", env={"TORCHBRIDGE_EMU_DEVICES": "abc"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1], lines
    assert lines[0].startswith("device 'emu' failed to start: TORCHBRIDGE_EMU_DEVICES='abc' is not a valid device count")
    assert lines[0].endswith("(its library's entry runs once per process: restart it to try again)")


def test_loading_after_the_first_backward_pass_warns_that_backward_on_the_device_would_fail():
    # PyTorch's autograd engine sizes its device queues at the process's first backward pass, for the
    # devices registered then: none on a CPU machine, one per GPU on a GPU machine. emu, loaded after,
    # can run backward on those indices only. emu gets 16 devices, more than a machine has GPUs.
    # Loading warns, forward passes work, and PyTorch's own failure on the first index without a
    # queue is the reference for what the warning says. The exit hook copes too.
    result = run_python("""
import re, warnings
import torch, torchbridge
x = torch.ones(2, requires_grad=True)
(x * 3).sum().backward()                      # the process's first backward pass, on the CPU
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torchbridge.devices.load("emu")
messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
# On a GPU machine loading also warns that emu takes autograd away from cuda (test_one_accelerator).
native = [m for m in messages if "is now PyTorch's accelerator for autograd" in m]
assert len(native) == (1 if torch.cuda.is_available() else 0), messages
messages = [m for m in messages if m not in native]
assert len(messages) == 1, messages
assert messages[0] == torchbridge._C.sdk_autograd_refusal(), messages
print(messages[0])
served = int(re.search(r"for (\\d+) device", messages[0]).group(1))
assert served == torch.cuda.device_count(), (served, torch.cuda.device_count())  # the GPUs torch counts

def backward_on(index):
    leaf = torch.ones(2, device=f"emu:{index}", requires_grad=True)
    loss = (leaf * 3).sum()
    assert loss.item() == 6.0                 # forward passes work
    try:
        loss.backward()
    except RuntimeError as error:
        return "device_ready_queues_" in str(error)
    return leaf.grad.cpu().tolist()

print("first index without a queue failed:", backward_on(served))
if served:
    print("an index with a queue:", backward_on(0))
""", env={"TORCHBRIDGE_EMU_DEVICES": "16"})
    assert result.returncode == 0, result.stderr
    assert "'emu' was loaded after this process's first backward pass" in result.stdout, result.stdout
    assert "load it before the first backward pass" in result.stdout
    assert "first index without a queue failed: True" in result.stdout, result.stdout
    assert "an index with a queue: [3.0, 3.0]" in result.stdout or "for 0 device(s)" in result.stdout, result.stdout
    assert "Warning:" not in result.stderr  # the warning came as a Python warning, not c10's stderr line
    assert "could not wait" not in result.stderr, result.stderr


def test_loading_before_any_backward_pass_does_not_warn():
    result = run_python("""
import warnings
import torch, torchbridge
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torchbridge.devices.load("emu")
# The one warning allowed is, on a GPU machine, that emu takes autograd away from cuda.
messages = [str(w.message) for w in caught]
native = [m for m in messages if "is now PyTorch's accelerator for autograd" in m]
assert len(native) == (1 if torch.cuda.is_available() else 0) and len(messages) == len(native), messages
assert torchbridge._C.sdk_autograd_refusal() is None
leaf = torch.ones(2, device="emu", requires_grad=True)
(leaf * 3).sum().backward()
print(leaf.grad.cpu().tolist())
""")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[3.0, 3.0]"


def test_exit_waits_for_autograd_device_threads_after_backward():
    # torch's device thread may still hold the last backward pass when the program ends; released
    # during interpreter finalization it aborts the process (python/src/autograd_exit.cpp). Loading
    # registers an exit hook that waits for each device index's thread first; it must run, once per
    # index, and work whatever grad mode the program ends in.
    result = run_python("""
import torch, torchbridge
torchbridge.devices.load("emu")
count = torchbridge._C.lookup("emu").device_count()
for index in range(count):
    w = torch.ones(3, device=f"emu:{index}", requires_grad=True)
    (w * 2).sum().backward()
    assert w.grad.cpu().tolist() == [2.0, 2.0, 2.0]
drain = torchbridge._C.drain_autograd_device_threads
with torch.inference_mode():
    assert drain() == count        # explicit call, even inside inference_mode
def counted():
    print("drained", drain(), "of", count)
torchbridge._C.drain_autograd_device_threads = counted            # observe the exit hook
torch.set_grad_enabled(False)                                     # the program ends with grad off
""", env={"TORCHBRIDGE_EMU_DEVICES": "2"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["drained", "2", "of", "2"], result.stdout


def test_no_device_thread_wait_without_a_device():
    result = run_python("import torchbridge; print(torchbridge._C.drain_autograd_device_threads())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


def test_a_program_ending_with_backward_exits_cleanly_on_one_cpu():
    # The race of python/src/autograd_exit.cpp made deterministic enough to test: pinned to one CPU,
    # the device thread rarely drops its task before the interpreter finalizes. Without the exit
    # hook this program aborted in 18 of 20 runs ("terminate called without an active exception").
    code = """
import os
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
import torch, torchbridge
torchbridge.devices.load("emu")
model = torch.nn.Linear(10, 2).to("emu")
loss = torch.nn.functional.mse_loss(model(torch.randn(4, 10, device="emu")), torch.randn(4, 2, device="emu"))
loss.backward()
"""
    for attempt in range(5):
        result = run_python(code)
        assert result.returncode == 0, f"attempt {attempt}: exit {result.returncode}\n{result.stderr[-2000:]}"
