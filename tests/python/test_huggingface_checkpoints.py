"""A Hugging Face GPT-2 built from a config in code (random weights, no downloads), saved sharded
with save_pretrained, read through our C++ reader; the rewritten weights give the same logits."""

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def tb(*args):
    return subprocess.run([CONSOLE_SCRIPT, "checkpoint", *args], capture_output=True, text=True, timeout=300)


def test_sharded_gpt2_reads_by_name_and_reproduces_the_logits(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=32)
    model = GPT2LMHeadModel(config).eval()
    hf_dir, ours = tmp_path / "hf", tmp_path / "ours.safetensors"
    model.save_pretrained(str(hf_dir), max_shard_size="20KB")
    index = json.loads((hf_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "the model must really be sharded"

    listing = json.loads(tb("inspect", str(hf_dir), "--json").stdout)
    assert listing["sharded"] and len(listing["shards"]) == len(set(index["weight_map"].values()))
    assert {t["name"] for t in listing["tensors"]} == set(index["weight_map"])
    assert tb("verify", str(hf_dir)).returncode == 0

    converted = tb("convert", str(hf_dir), str(ours))  # our reader -> our writer
    assert converted.returncode == 0, converted.stderr
    restored = GPT2LMHeadModel(config).eval()
    missing, unexpected = restored.load_state_dict(load_file(str(ours)), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding, as HF saves it
    restored.tie_weights()
    tokens = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        assert torch.equal(restored(tokens).logits, model(tokens).logits)


def test_resharding_round_trip(tmp_path):
    tensors = {f"layer{i}.weight": torch.randn(64, 64) for i in range(6)}
    from safetensors.torch import save_file

    save_file(tensors, str(tmp_path / "one.safetensors"))
    result = tb("convert", str(tmp_path / "one.safetensors"), str(tmp_path / "sharded"), "--shard-size", "40KB")
    assert result.returncode == 0, result.stderr
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards[0] == "model-00001-of-00003.safetensors" and len(shards) == 3  # 16,384 B each: two fit in 40 KB
    for shard in shards:
        assert os.path.getsize(tmp_path / "sharded" / shard) <= 40_000 + 4096
    assert index["metadata"]["total_size"] == 6 * 64 * 64 * 4
    back = tb("convert", str(tmp_path / "sharded"), str(tmp_path / "again.safetensors"))
    assert back.returncode == 0
    again = load_file(str(tmp_path / "again.safetensors"))
    assert all(torch.equal(again[k], v) for k, v in tensors.items())
    bad = tb("convert", str(tmp_path / "one.safetensors"), str(tmp_path / "x"), "--shard-size", "12XB")
    assert bad.returncode == 1 and "unknown unit 'XB'" in bad.stderr
