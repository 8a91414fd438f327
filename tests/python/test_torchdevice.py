"""The TorchDevice compatibility module, as TorchDevice programs use it: each case in a fresh
interpreter (importing TorchDevice turns redirection on for the whole process), with the target
named by TORCHBRIDGE_BACKEND. Results are compared with the same computation on the CPU."""

import importlib.metadata
import os
import pathlib
import sys
import textwrap

import pytest

from conftest import run_python

EMU = {"TORCHBRIDGE_BACKEND": "emu", "TORCHBRIDGE_EMU_GUARDED": "1"}


def run(code: str, env: "dict | None" = None):
    result = run_python(textwrap.dedent(code), env={**EMU, **(env or {})})
    return result


def ok(code: str, env: "dict | None" = None) -> str:
    result = run(code, env)
    assert result.returncode == 0, f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    return result.stdout


def test_installed_with_the_package_not_found_through_the_source_tree():
    # The tests run from tests/python; python/ is not on sys.path, so this is the installed copy.
    out = ok("import TorchDevice, torchbridge; print(TorchDevice.__file__); print(torchbridge.__file__)")
    module_file, package_file = (pathlib.Path(line) for line in out.split())
    assert module_file.parent.parent == package_file.parent.parent, (module_file, package_file)
    assert "site-packages" in module_file.parts
    shipped = [str(f) for f in importlib.metadata.files("torchbridge") or []]
    assert "TorchDevice/__init__.py" in shipped, "the wheel must ship the TorchDevice module"


def test_import_enables_redirection_to_the_named_backend():
    out = ok("""
        import TorchDevice
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(10, 3)
        batch = torch.randn(4, 10)
        want = model(batch)
        model = model.cuda()
        got = model(batch.to("cuda"))
        assert got.device == torch.device("emu:0"), got.device
        assert torch.allclose(got.cpu(), want, atol=1e-6)
        assert torch.randn(2, device="cuda").device.type == "emu"
        assert torch.zeros(2, device="cpu").device.type == "cpu"   # explicit cpu stays
        print("target", TorchDevice.TorchDevice._default_device)
    """)
    assert "target emu" in out


def test_torchdevice_class_gives_the_device_and_training_works():
    ok("""
        import torch
        from TorchDevice import TorchDevice
        device = TorchDevice()
        assert device.device == torch.device("emu:0") and str(device) == "emu:0" and device.type == "emu"
        assert TorchDevice("cuda:1").device == torch.device("emu:1")
        assert TorchDevice("cpu").device == torch.device("cpu")
        assert TorchDevice("cuda", 1).device.index == 1
        torch.manual_seed(0)
        reference = torch.nn.Linear(10, 2)
        model = torch.nn.Linear(10, 2)
        model.load_state_dict(reference.state_dict())
        model = model.to(device.device)
        x, y = torch.randn(4, 10), torch.randn(4, 2)
        for m, dev in ((reference, "cpu"), (model, device.device)):
            optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
            loss = torch.nn.functional.mse_loss(m(x.to(dev)), y.to(dev))
            loss.backward()
            optimizer.step()
        assert model.weight.device.type == "emu"
        assert torch.allclose(model.weight.cpu(), reference.weight, atol=1e-6)
    """)


def test_cpu_minus_one_toggles_the_process_wide_override():
    ok("""
        import TorchDevice
        import torch
        from TorchDevice import TorchDevice as TD
        assert torch.randn(2, device="cuda").device.type == "emu"
        assert TD._cpu_override is False
        assert torch.device("cpu:-1").type == "cpu"        # on
        assert TD._cpu_override is True
        assert torch.randn(2, device="cuda").device.type == "cpu"
        assert torch.ones(2).cuda().device.type == "cpu"
        torch.device("cpu:-1")                              # off again
        assert TD._cpu_override is False
        assert torch.randn(2, device="cuda").device.type == "emu"
    """)


def test_cpu_target_from_the_environment():
    ok("""
        import TorchDevice, torch
        from TorchDevice import TorchDevice as TD
        assert TD().device.type == "cpu"
        assert torch.ones(2).cuda().device.type == "cpu"
    """, env={"TORCHBRIDGE_BACKEND": "cpu"})


def test_bad_target_raises_at_import_naming_it():
    result = run("import TorchDevice", env={"TORCHBRIDGE_BACKEND": "warp"})
    assert result.returncode != 0 and "'warp'" in result.stderr, result.stderr


def test_bad_arguments_and_missing_internals_are_clear_errors():
    ok("""
        import TorchDevice
        from TorchDevice import TorchDevice as TD
        import torch

        def raises(kind, text, call):
            try:
                call()
            except kind as error:
                assert text in str(error), str(error)
            else:
                raise AssertionError(f"no {kind.__name__} for {text}")

        raises(TypeError, "device_type must be a str", lambda: TD(3.5))
        raises(TypeError, "device_index must be an int or None", lambda: TD("cuda", "1"))
        raises(ValueError, "'cuda:1' already names an index", lambda: TD("cuda:1", 0))
        raises(AttributeError, "has no attribute 'DeviceManager'", lambda: TorchDevice.DeviceManager)
        raises(ModuleNotFoundError, "No module named 'TorchDevice.core'", lambda: __import__("TorchDevice.core"))
    """)
    result = run("import TorchDevice", env={"TORCHDEVICE_LOG_LEVEL": "LOUD"})
    assert result.returncode != 0 and "TORCHDEVICE_LOG_LEVEL='LOUD'" in result.stderr, result.stderr
