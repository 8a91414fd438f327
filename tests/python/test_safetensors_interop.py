"""Our C++ safetensors reader and writer against the Python `safetensors` package, both ways:
files it writes are read (and rewritten) by ours, files ours writes load bit-exactly in it."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64,
          torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.complex64, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
          torch.float4_e2m1fn_x2]


def tb(*args):
    return subprocess.run([CONSOLE_SCRIPT, "checkpoint", *args], capture_output=True, text=True, timeout=120)


def random_bits(dtype, shape):
    count = int(torch.tensor(shape).prod().item()) if shape else 1
    raw = torch.randint(0, 256, (count * torch.empty(0, dtype=dtype).element_size(),), dtype=torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def bit_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))


@pytest.fixture
def tensors():
    torch.manual_seed(0)
    out = {str(dtype).split(".")[-1]: random_bits(dtype, [3, 7]) for dtype in DTYPES}
    out["scalar"] = torch.tensor(1.5)
    out["empty"] = torch.empty(0, 3)
    return out


def test_files_python_writes_are_read_and_rewritten_bit_exactly(tmp_path, tensors):
    theirs, ours = tmp_path / "theirs.safetensors", tmp_path / "ours.safetensors"
    save_file(tensors, str(theirs), metadata={"format": "pt", "origin": "python"})
    assert tb("verify", str(theirs)).returncode == 0
    converted = tb("convert", str(theirs), str(ours))
    assert converted.returncode == 0, converted.stderr
    reloaded = load_file(str(ours))  # python reads what we wrote
    assert set(reloaded) == set(tensors)
    for name, original in tensors.items():
        assert bit_equal(reloaded[name], original), name
    with safe_open(str(ours), "pt") as f:
        assert f.metadata() == {"format": "pt", "origin": "python"}


def test_inspect_agrees_with_the_python_reader(tmp_path, tensors):
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path))
    listing = json.loads(tb("inspect", str(path), "--json").stdout)
    ours = {t["name"]: t for t in listing["tensors"]}
    with safe_open(str(path), "pt") as f:
        assert set(ours) == set(f.keys())
        for name in f.keys():
            assert ours[name]["shape"] == list(f.get_slice(name).get_shape()), name
            assert ours[name]["dtype"] == f.get_slice(name).get_dtype(), name


def test_dtype_conversion(tmp_path):
    source, target = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"w": torch.randn(4, 4), "ids": torch.arange(4)}, str(source))
    assert tb("convert", str(source), str(target), "--dtype", "bfloat16").returncode == 0
    out = load_file(str(target))
    assert out["w"].dtype == torch.bfloat16 and out["ids"].dtype == torch.int64  # integers untouched
    assert torch.equal(out["w"], load_file(str(source))["w"].to(torch.bfloat16))
    bad = tb("convert", str(source), str(target), "--dtype", "float7")
    assert bad.returncode == 1 and "unknown --dtype 'float7'" in bad.stderr


def test_corruption_is_reported_with_exit_code_one(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"w": torch.randn(16)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-4])  # truncate the data section
    result = tb("verify", str(path))
    assert result.returncode == 1
    assert "tensor" in result.stderr or "truncated" in result.stderr
    assert str(path) in result.stderr
