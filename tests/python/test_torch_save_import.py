"""State dicts saved by Python's torch.save enter the C++ checkpoint pipeline (convert to safetensors)."""

import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def convert(source, target, *extra):
    return subprocess.run([CONSOLE_SCRIPT, "checkpoint", "convert", str(source), str(target), *extra],
                          capture_output=True, text=True, timeout=120)


def test_plain_dict_state_dicts_convert_bit_exactly(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    state = dict(model.state_dict())
    torch.save(state, tmp_path / "model.pt")
    result = convert(tmp_path / "model.pt", tmp_path / "model.safetensors")
    assert result.returncode == 0, result.stderr
    loaded = load_file(str(tmp_path / "model.safetensors"))
    assert set(loaded) == set(state)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_ordered_dict_state_dicts_get_a_clear_explanation(tmp_path):
    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "ordered.pt")
    result = convert(tmp_path / "ordered.pt", tmp_path / "out.safetensors")
    assert result.returncode == 1
    assert "collections.OrderedDict" in result.stderr and "dict(model.state_dict())" in result.stderr
    assert not (tmp_path / "out.safetensors").exists()


def test_non_state_dicts_are_refused(tmp_path):
    torch.save([torch.ones(2)], tmp_path / "list.pt")
    result = convert(tmp_path / "list.pt", tmp_path / "out.safetensors")
    assert result.returncode == 1 and "not a state dict" in result.stderr
