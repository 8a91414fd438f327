"""torchbridge.checkpoint: the C++ reader/writer from Python, against the Python safetensors package."""

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
    assert "model.safetensors.index.json" in written and len(written) == 3
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
