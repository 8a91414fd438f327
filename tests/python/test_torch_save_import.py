"""State dicts saved by Python's torch.save enter the C++ checkpoint pipeline (convert to safetensors).

Python torch writes every file here and Python (torch.load, safetensors) is the reference the
C++ reader's output is compared with, bit for bit."""

import collections
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest
import torch
from safetensors.torch import load_file, save_file

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def convert(source, target, *extra):
    return subprocess.run([CONSOLE_SCRIPT, "checkpoint", "convert", str(source), str(target), *extra],
                          capture_output=True, text=True, timeout=120)


def bits(tensor):
    """The tensor's values as raw bytes, so NaNs and signed zeros compare exactly."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def assert_bit_exact(loaded, reference):
    assert set(loaded) == set(reference)
    for name, tensor in reference.items():
        assert loaded[name].dtype == tensor.dtype, name
        assert loaded[name].shape == tensor.shape, name
        assert torch.equal(bits(loaded[name]), bits(tensor)), name


class Model(torch.nn.Module):
    """Parameters and buffers in several dtypes, and a buffer that is a non-contiguous view of a
    parameter's storage (torch.save keeps the two sharing one storage)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6).to(torch.bfloat16)
        self.proj = torch.nn.Linear(6, 4)
        self.norm = torch.nn.BatchNorm1d(4)  # running stats and an int64 num_batches_tracked
        self.head = torch.nn.Linear(4, 3).half()
        self.register_buffer("proj_t", self.proj.weight.detach().t()[1:])
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("codes", torch.arange(-4, 4, dtype=torch.int8))
        self.register_buffer("scale", torch.tensor(float("nan")))  # 0-dim


def model_state():
    torch.manual_seed(0)
    model = Model()
    model.norm.train()(torch.randn(5, 4))  # real running statistics, num_batches_tracked = 1
    state = model.state_dict()
    assert type(state) is collections.OrderedDict and hasattr(state, "_metadata")
    assert state["proj_t"].untyped_storage().data_ptr() == state["proj.weight"].untyped_storage().data_ptr()
    assert not state["proj_t"].is_contiguous()
    return state


def test_module_state_dicts_convert_bit_exactly(tmp_path):
    state = model_state()
    torch.save(state, tmp_path / "model.pt")
    result = convert(tmp_path / "model.pt", tmp_path / "model.safetensors")
    assert result.returncode == 0, result.stderr
    # The second sharer (the root's buffers come before its children's entries) is written as its
    # own copy, and the command says so.
    assert "'proj.weight' shares storage with 'proj_t'" in result.stderr
    assert_bit_exact(load_file(str(tmp_path / "model.safetensors")), torch.load(tmp_path / "model.pt"))


@pytest.mark.parametrize("name", ["model.ckpt", "weights.tar", "state"])
def test_a_torch_save_file_is_told_by_its_content_not_its_name(tmp_path, name):
    # Lightning writes .ckpt, older tutorials .tar; the extension-based choice read these as
    # safetensors and answered "`torchbridge checkpoint convert` turns it into safetensors".
    state = {"w": torch.randn(3, 2), "steps": torch.tensor(7)}
    torch.save(state, tmp_path / name)
    result = convert(tmp_path / name, tmp_path / "out.safetensors")
    assert result.returncode == 0, result.stderr
    assert_bit_exact(load_file(str(tmp_path / "out.safetensors")), state)


def safetensors_with_a_640_byte_header(path):
    """A valid safetensors file whose first bytes are 80 02, as a pickle's (header length 0x280)."""
    for pad in range(2000):
        save_file({"w": torch.arange(6.0).reshape(2, 3)}, str(path), metadata={"pad": "x" * pad})
        if path.read_bytes()[:8] == (640).to_bytes(8, "little"):
            return
    raise AssertionError("no padding gave a 640-byte header")


def test_a_safetensors_file_that_begins_like_a_pickle_converts_and_reads_as_safetensors(tmp_path):
    # Two bytes told a legacy torch.save file: this one was refused as "a torch.save file in the
    # legacy format"; cut short, it was called "a Python pickle".
    safetensors_with_a_640_byte_header(tmp_path / "h640.safetensors")
    result = convert(tmp_path / "h640.safetensors", tmp_path / "out.safetensors")
    assert result.returncode == 0, result.stderr
    assert_bit_exact(load_file(str(tmp_path / "out.safetensors")), {"w": torch.arange(6.0).reshape(2, 3)})
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "h640.safetensors").read_bytes()[:300])
    verify = subprocess.run([CONSOLE_SCRIPT, "checkpoint", "verify", str(tmp_path / "cut.safetensors")],
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 1 and "header length 640 runs past the end of the 300-byte file" in verify.stderr


def test_a_safetensors_file_named_like_a_torch_save_file_converts_as_safetensors(tmp_path):
    state = {"w": torch.randn(3, 2)}
    save_file(state, str(tmp_path / "model.bin"))
    result = convert(tmp_path / "model.bin", tmp_path / "out.safetensors", "--dtype", "float64")
    assert result.returncode == 0, result.stderr
    assert_bit_exact(load_file(str(tmp_path / "out.safetensors")), {"w": state["w"].double()})


def test_entries_keep_the_order_of_the_file(tmp_path):
    state = model_state()
    torch.save(state, tmp_path / "model.pt")
    # One tensor per shard, so the shard numbers show the order the reader produced.
    result = convert(tmp_path / "model.pt", tmp_path / "sharded", "--shard-size", "1")
    assert result.returncode == 0, result.stderr
    weight_map = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(weight_map, key=weight_map.get) == list(state)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_every_pickle_protocol_torch_save_accepts(tmp_path, protocol):
    state = model_state()
    torch.save(state, tmp_path / "model.pt", pickle_protocol=protocol)
    result = convert(tmp_path / "model.pt", tmp_path / "model.safetensors")
    assert result.returncode == 0, result.stderr
    assert_bit_exact(load_file(str(tmp_path / "model.safetensors")), state)


def test_dtypes_saved_with_untyped_storages(tmp_path):
    # float8, uint16/32/64 go through torch._utils._rebuild_tensor_v3 with an untyped storage.
    base = torch.linspace(-3, 3, 12)
    state = {"f8_e4m3": base.to(torch.float8_e4m3fn), "f8_e5m2": base.to(torch.float8_e5m2),
             "u16": torch.arange(12).to(torch.uint16), "u32": (torch.arange(12) * 70000).to(torch.uint32),
             "u64": (torch.arange(12) << 40).to(torch.uint64), "f64": base.double(), "c64": base.to(torch.complex64),
             "empty": torch.empty(0, 3), "param": torch.nn.Parameter(base.reshape(3, 4))}
    torch.save(state, tmp_path / "model.pt")
    result = convert(tmp_path / "model.pt", tmp_path / "model.safetensors")
    assert result.returncode == 0, result.stderr
    assert_bit_exact(load_file(str(tmp_path / "model.safetensors")),
                     {k: v.detach() for k, v in torch.load(tmp_path / "model.pt").items()})


def test_views_with_offsets_and_strides(tmp_path):
    storage = torch.arange(60, dtype=torch.float32)
    state = collections.OrderedDict(
        [("strided", storage[3:].reshape(3, 19)[:, ::4]), ("tail", storage[50:55]), ("expanded", storage[:4].expand(2, 4))])
    torch.save(state, tmp_path / "views.pt")
    result = convert(tmp_path / "views.pt", tmp_path / "views.safetensors")
    assert result.returncode == 0, result.stderr
    assert_bit_exact(load_file(str(tmp_path / "views.safetensors")), state)


def test_conjugated_tensors_are_resolved(tmp_path):
    value = torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64)
    state = {"conj": value.conj(), "plain": value}
    torch.save(state, tmp_path / "conj.pt")
    result = convert(tmp_path / "conj.pt", tmp_path / "conj.safetensors")
    assert result.returncode == 0, result.stderr
    loaded = load_file(str(tmp_path / "conj.safetensors"))
    assert torch.equal(loaded["conj"], value.conj().resolve_conj()) and torch.equal(loaded["plain"], value)


def test_nested_state_dicts_get_dotted_names(tmp_path):
    model = torch.nn.Linear(3, 2)
    state = {"model": model.state_dict(), "ema": {"decay": {"weight": torch.ones(2)}}}
    torch.save(state, tmp_path / "nested.pt")
    result = convert(tmp_path / "nested.pt", tmp_path / "nested.safetensors")
    assert result.returncode == 0, result.stderr
    assert_bit_exact(load_file(str(tmp_path / "nested.safetensors")),
                     {"model.weight": model.weight.detach(), "model.bias": model.bias.detach(),
                      "ema.decay.weight": torch.ones(2)})


def test_plain_dict_state_dicts_convert_bit_exactly(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    state = dict(model.state_dict())
    torch.save(state, tmp_path / "model.pt")
    result = convert(tmp_path / "model.pt", tmp_path / "model.safetensors")
    assert result.returncode == 0, result.stderr
    assert_bit_exact(load_file(str(tmp_path / "model.safetensors")), state)


def refused(tmp_path, value, **save_options):
    torch.save(value, tmp_path / "in.pt", **save_options)
    result = convert(tmp_path / "in.pt", tmp_path / "out.safetensors")
    assert result.returncode == 1
    assert not (tmp_path / "out.safetensors").exists()
    return result.stderr


def test_non_state_dicts_are_refused(tmp_path):
    assert "in.pt: holds a list, not a state dict" in refused(tmp_path, [torch.ones(2)])


def test_non_tensor_entries_are_named(tmp_path):
    message = refused(tmp_path, {"model": {"weight": torch.ones(2)}, "epoch": 3})
    assert "entry 'epoch' is an int, not a tensor" in message


def test_non_string_keys_are_refused(tmp_path):
    assert "has a key of type int" in refused(tmp_path, {0: torch.ones(2)})


def test_a_dict_referred_to_over_and_over_is_refused_not_flattened_forever(tmp_path):
    # 40 levels of {"a": d, "b": d} are a few kB in the pickle (its memo) and 2^40 names flattened.
    state = {"w": torch.ones(1)}
    for _ in range(40):
        state = {"a": state, "b": state}
    message = refused(tmp_path, state)
    assert "entries once its nested dicts are flattened" in message, message


def test_python_objects_are_refused_not_run(tmp_path):
    message = refused(tmp_path, {"size": torch.Size([2, 3])})
    assert "the pickle calls torch.Size, which a state dict does not hold" in message


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_legacy_files_are_named_as_such_whatever_their_pickle_protocol(tmp_path, protocol):
    message = refused(tmp_path, {"w": torch.ones(2)}, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    assert "in.pt: a torch.save file in the legacy format" in message and "re-save" in message


def test_foreign_files_are_refused(tmp_path):
    (tmp_path / "text.pt").write_text("not a checkpoint")
    result = convert(tmp_path / "text.pt", tmp_path / "out.safetensors")
    # Told by its content (not its name) to be no torch.save file, it is read as safetensors, and
    # the error says it is neither.
    assert result.returncode == 1 and "text.pt: header length" in result.stderr, result.stderr
    assert "it does not begin as a torch.save file does" in result.stderr


def test_a_whole_model_saved_by_torch_save_is_named_with_its_class(tmp_path):
    # The common mistake, torch.save(model): the error named only "opcode 0x81".
    torch.save(torch.nn.Sequential(torch.nn.Linear(2, 2)), tmp_path / "whole.pt")
    result = convert(tmp_path / "whole.pt", tmp_path / "out.safetensors")
    assert result.returncode == 1
    assert ("it builds an object of class 'torch.nn.modules.container.Sequential': torch.save of a whole model or "
            "another object, not of a state dict; save model.state_dict() instead") in result.stderr


def rewrite_pickle(source, target, edit):
    """Copies a torch.save archive, passing its data.pkl through `edit`."""
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as out:
        for item in archive.infolist():
            data = archive.read(item)
            out.writestr(item, edit(data) if item.filename.endswith("data.pkl") else data)


def test_truncated_pickles_are_refused(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "good.pt")
    rewrite_pickle(tmp_path / "good.pt", tmp_path / "cut.pt", lambda data: data[:len(data) // 2])
    result = convert(tmp_path / "cut.pt", tmp_path / "out.safetensors")
    assert result.returncode == 1 and "cut.pt: pickle byte" in result.stderr, result.stderr


def test_storage_sizes_are_checked_against_their_records(tmp_path):
    torch.save({"w": torch.ones(4)}, tmp_path / "good.pt")
    # The persistent id ('storage', FloatStorage, '0', 'cpu', 4) ends with BININT1 4, TUPLE.
    rewrite_pickle(tmp_path / "good.pt", tmp_path / "long.pt", lambda data: data.replace(b"K\x04t", b"K\x05t", 1))
    result = convert(tmp_path / "long.pt", tmp_path / "out.safetensors")
    assert result.returncode == 1
    assert "long.pt: record data/0 holds 16 bytes, but its storage of 5 Float elements needs 20" in result.stderr


FIXTURES = sorted((pathlib.Path(__file__).parent / "data").glob("torch_save_*.pt"))


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_files_written_by_another_torch_convert_bit_exactly(tmp_path, fixture):
    """A state dict written by another torch than this environment's (data/make_torch_save_fixture.py
    wrote it: an OrderedDict of Parameters and buffers in eight dtypes, a strided view, a Linear
    under two names); this environment's torch.load is the reference."""
    reference = torch.load(fixture, weights_only=True)
    assert type(reference) is collections.OrderedDict
    assert reference["tied.weight"].untyped_storage().data_ptr() == reference["proj.weight"].untyped_storage().data_ptr()
    run = convert(fixture, tmp_path / "converted.safetensors")
    assert run.returncode == 0, run.stderr
    assert_bit_exact(load_file(str(tmp_path / "converted.safetensors")), reference)


def test_a_transformers_pytorch_model_bin_converts_bit_exactly(tmp_path):
    """What most Hub checkpoints are: pytorch_model.bin, a torch.save of a transformers model's
    OrderedDict state dict in which tied weights (GPT-2's lm_head and its token embedding) share
    one storage. The transformers installed here (5.x) writes safetensors only, whatever
    ``safe_serialization`` says, so the file is written as transformers 4's
    ``save_pretrained(safe_serialization=False)`` wrote it: ``torch.save(model.state_dict())``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=32)).eval()
    source = tmp_path / "pytorch_model.bin"
    torch.save(model.state_dict(), source)
    reference = torch.load(source, weights_only=True)
    assert type(reference) is collections.OrderedDict
    assert reference["lm_head.weight"].data_ptr() == reference["transformer.wte.weight"].data_ptr()  # tied
    run = convert(source, tmp_path / "gpt2.safetensors")
    assert run.returncode == 0, run.stderr
    converted = load_file(str(tmp_path / "gpt2.safetensors"))
    assert_bit_exact(converted, reference)
    # The converted file restores the model: identical logits.
    restored = GPT2LMHeadModel(model.config).eval()
    restored.load_state_dict(converted)
    ids = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        assert torch.equal(restored(ids).logits, model(ids).logits)
