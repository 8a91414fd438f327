"""torchbridge.checkpoint: the C++ reader/writer from Python, against the Python safetensors package."""

import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import torchbridge
from torchbridge import checkpoint


def test_save_and_load_round_trip_every_dtype(tmp_path):
    tensors = {str(d).split(".")[-1]: torch.randint(0, 2, (3, 4)).to(d) for d in
               (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                torch.float32, torch.float64, torch.float8_e4m3fn, torch.uint16, torch.uint32)}
    tensors["strided"] = torch.arange(12.0).view(3, 4).t()
    path = tmp_path / "t.safetensors"
    checkpoint.save(path, tensors, metadata={"k": "v"})
    assert checkpoint.metadata(path) == {"k": "v"}
    assert set(checkpoint.names(path)) == set(tensors)
    loaded = checkpoint.load(path)
    theirs = load_file(str(path))  # the reference reader agrees
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name].view(torch.uint8), t.contiguous().view(torch.uint8))
        assert torch.equal(theirs[name].view(torch.uint8), loaded[name].view(torch.uint8))


def test_subset_device_and_sharding(tmp_path):
    torchbridge.devices.load("emu")
    tensors = {f"w{i}": torch.randn(32, 32) for i in range(4)}
    written = checkpoint.save(tmp_path / "shards", tensors, max_shard_size="9KB")
    assert written[-1] == str(tmp_path / "shards" / "model.safetensors.index.json") and len(written) == 3
    assert all(os.path.isfile(path) for path in written)  # each entry opens as it stands
    subset = checkpoint.load(tmp_path / "shards", names=["w3"], device="emu:1")
    assert list(subset) == ["w3"] and subset["w3"].device == torch.device("emu:1")
    assert torch.equal(subset["w3"].cpu(), tensors["w3"])


def test_errors(tmp_path):
    weight = torch.randn(4, 4)
    with pytest.raises(ValueError, match="'a' and 'b' share storage"):
        checkpoint.save(tmp_path / "x.safetensors", {"a": weight, "b": weight.t()})
    save_file({"x": torch.ones(2)}, str(tmp_path / "ok.safetensors"))
    with pytest.raises(ValueError, match="no tensor named 'y'"):
        checkpoint.load(tmp_path / "ok.safetensors", names=["y"])
    (tmp_path / "bad.safetensors").write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00{}}}")
    with pytest.raises(ValueError, match="bad.safetensors"):
        checkpoint.names(tmp_path / "bad.safetensors")


def test_views_sharing_no_bytes_are_saved_as_the_safetensors_package_saves_them(tmp_path):
    fused = torch.randn(6, 4)  # a fused qkv weight, split into its parts
    parts = {"q": fused[:2], "k": fused[2:4], "v": fused[4:]}
    save_file(parts, str(tmp_path / "theirs.safetensors"))  # the reference accepts them
    checkpoint.save(tmp_path / "ours.safetensors", parts)
    loaded = checkpoint.load(tmp_path / "ours.safetensors")
    assert all(torch.equal(loaded[name], part) for name, part in parts.items())
    with pytest.raises(ValueError, match="'a' and 'b' share storage"):
        checkpoint.save(tmp_path / "x.safetensors", {"a": fused[:3], "b": fused[2:]})


def test_an_empty_list_of_names_loads_none_and_a_string_is_refused(tmp_path):
    save_file({"a": torch.ones(2), "b": torch.zeros(2)}, str(tmp_path / "t.safetensors"))
    assert checkpoint.load(tmp_path / "t.safetensors", names=[]) == {}
    assert set(checkpoint.load(tmp_path / "t.safetensors")) == {"a", "b"}
    with pytest.raises(TypeError, match="names must be a list of tensor names or None, got the string 'ab'"):
        checkpoint.load(tmp_path / "t.safetensors", names="ab")


def test_an_error_holding_bytes_that_are_not_utf8_still_names_the_file(tmp_path):
    # A header with the byte 0xff in a name: the message quotes the bytes the parser stopped at,
    # and Python's strict decoding of them raised UnicodeDecodeError in place of the error.
    header = b'{"\xff":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    with pytest.raises(ValueError, match=r"bad\.safetensors: header is not valid JSON.*\\xff"):
        checkpoint.load(path)


def test_float4_round_trips_with_the_safetensors_package(tmp_path):
    packed = torch.arange(12, dtype=torch.uint8).view(4, 3).view(torch.float4_e2m1fn_x2)
    checkpoint.save(tmp_path / "ours.safetensors", {"w": packed})
    theirs = load_file(str(tmp_path / "ours.safetensors"))["w"]
    assert theirs.dtype == packed.dtype and theirs.shape == (4, 3)
    assert torch.equal(theirs.view(torch.uint8), packed.view(torch.uint8))
    save_file({"w": packed}, str(tmp_path / "theirs.safetensors"))
    ours = checkpoint.load(tmp_path / "theirs.safetensors")["w"]
    assert ours.dtype == packed.dtype and torch.equal(ours.view(torch.uint8), packed.view(torch.uint8))
