"""The checkpoint writer and the command line against what users do to directories and files:
converting into a directory that already holds a checkpoint, failing half way, converting a file
onto itself, malformed indexes, long tensor names, repeated options. Each case was a defect found
by using the CLI as a user would (2026-11-27); files are read back with the Python `safetensors`
package and torch, independent of our reader."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def tb(*args, timeout=300):
    return subprocess.run([CONSOLE_SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def listing(directory):
    return sorted(os.listdir(directory))


def file_bytes(directory):
    return {name: (directory / name).read_bytes() for name in listing(directory)}


def test_an_index_that_maps_no_tensors_is_an_error_not_a_crash(tmp_path):
    # Checkpoint::metadata() read the first of no shards: SIGSEGV in inspect, convert and the
    # Python API; verify called it valid.
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": {}}')
    for args in (["checkpoint", "inspect", tmp_path], ["checkpoint", "verify", tmp_path],
                 ["checkpoint", "convert", tmp_path, tmp_path / "out.safetensors"]):
        result = tb(*args)
        assert result.returncode == 1, (args, result.returncode, result.stdout)
        assert "maps no tensors" in result.stderr


@pytest.mark.parametrize("shard", ["", ".", ".."])
def test_an_index_naming_no_file_is_refused_by_name(tmp_path, shard):
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"w": "%s"}}' % shard)
    result = tb("checkpoint", "verify", tmp_path)
    assert result.returncode == 1 and "must be a plain file name" in result.stderr


def test_a_directory_or_fifo_given_as_a_file_is_named_as_such(tmp_path):
    # mmap's "No such device" was the message for a directory.
    (tmp_path / "d.safetensors").mkdir()
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"w": "d.safetensors"}}')
    assert "d.safetensors: is a directory" in tb("checkpoint", "inspect", tmp_path).stderr
    os.mkfifo(tmp_path / "f.safetensors")
    fifo = tb("checkpoint", "inspect", tmp_path / "f.safetensors", timeout=60)  # it waited for a writer
    assert fifo.returncode == 1 and "is not a regular file" in fifo.stderr


def state(scale):
    torch.manual_seed(scale)
    return {f"layer{i}.weight": torch.randn(10, 10) * scale for i in range(6)}


def test_a_failed_sharded_write_leaves_the_directory_as_it_was(tmp_path):
    # Shards were written in place: a late failure left new and old shards together, and the old
    # index called the mix valid.
    old, bad = tmp_path / "old.pt", tmp_path / "bad.pt"
    torch.save(state(1), old)
    torch.save({**state(2), "z": torch.zeros(3, dtype=torch.complex128)}, bad)
    target = tmp_path / "ckpt"
    assert tb("checkpoint", "convert", old, target, "--shard-size", "1000B").returncode == 0
    before = file_bytes(target)
    failed = tb("checkpoint", "convert", bad, target, "--shard-size", "1000B")
    assert failed.returncode == 1
    assert "tensor 'z' has dtype ComplexDouble, which safetensors cannot hold" in failed.stderr
    assert file_bytes(target) == before  # nothing changed, no staging directory left
    fresh = tmp_path / "fresh"
    assert tb("checkpoint", "convert", bad, fresh, "--shard-size", "1000B").returncode == 1
    assert not fresh.exists()  # as it was: absent (an empty directory was left)


def test_a_directory_holds_exactly_the_checkpoint_written_last(tmp_path):
    # The old index stayed beside a new single file (and won), an old single file beside a new
    # index (transformers read it), and shards of other counts piled up.
    source = tmp_path / "source.pt"
    torch.save(state(1), source)
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "config.json").write_text("{}")  # not the checkpoint's: stays
    tb("checkpoint", "convert", source, target, "--shard-size", "500B")
    assert len([n for n in listing(target) if n.startswith("model-")]) == 6
    three = tb("checkpoint", "convert", source, target, "--shard-size", "1000B")
    # The index was counted as a file of tensors ("in 4 files").
    assert three.stdout == f"{target}: wrote 6 tensors in 3 shards and model.safetensors.index.json\n", three.stdout
    assert listing(target) == ["config.json", "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                               "model-00003-of-00003.safetensors", "model.safetensors.index.json"]
    one = tb("checkpoint", "convert", source, target, "--shard-size", "1GB")
    assert one.returncode == 0 and one.stdout == f"{target}: wrote 6 tensors in 1 shard\n", one.stdout
    assert listing(target) == ["config.json", "model.safetensors"]
    reloaded = load_file(str(target / "model.safetensors"))
    assert all(torch.equal(reloaded[name], value) for name, value in state(1).items())
    tb("checkpoint", "convert", source, target, "--shard-size", "2000B")
    assert "model.safetensors" not in listing(target) and "model.safetensors.index.json" in listing(target)


def test_a_sharded_directory_converts_in_place(tmp_path):
    source = tmp_path / "source.pt"
    torch.save(state(1), source)
    target = tmp_path / "ckpt"
    tb("checkpoint", "convert", source, target, "--shard-size", "1000B")
    converted = tb("checkpoint", "convert", target, target, "--dtype", "float16", "--shard-size", "1000B")
    assert converted.returncode == 0, converted.stderr
    inspected = tb("checkpoint", "inspect", target, "--json").stdout
    assert '"F32"' not in inspected and '"F16"' in inspected
    for name, value in state(1).items():
        shard = next(f for f in listing(target) if f.endswith(".safetensors") and name in load_file(str(target / f)))
        assert torch.equal(load_file(str(target / shard))[name], value.to(torch.float16))


def test_convert_refuses_to_write_over_an_input_it_would_destroy(tmp_path):
    pt = tmp_path / "same.pt"
    torch.save(state(1), pt)
    original = pt.read_bytes()
    result = tb("checkpoint", "convert", pt, pt)
    assert result.returncode != 0 and "is the input itself" in result.stderr
    assert pt.read_bytes() == original and torch.load(pt)["layer0.weight"].shape == (10, 10)
    sharded = tmp_path / "ckpt"
    tb("checkpoint", "convert", pt, sharded, "--shard-size", "1000B")
    index = sharded / "model.safetensors.index.json"
    assert "is the input itself" in tb("checkpoint", "convert", index, index).stderr
    assert "names a JSON file" in tb("checkpoint", "convert", pt, tmp_path / "x.json").stderr
    assert "OUT is empty" in tb("checkpoint", "convert", pt, "").stderr
    # A safetensors file rewritten in place is fine: the input stays mapped until the new file
    # replaces it.
    single = tmp_path / "single.safetensors"
    save_file(state(1), str(single))
    assert tb("checkpoint", "convert", single, single, "--dtype", "bfloat16").returncode == 0
    assert torch.equal(load_file(str(single))["layer0.weight"], state(1)["layer0.weight"].to(torch.bfloat16))


def test_convert_refuses_one_shard_into_the_directory_whose_checkpoint_it_would_replace(tmp_path):
    pt = tmp_path / "source.pt"
    torch.save(state(1), pt)
    sharded = tmp_path / "ckpt"
    tb("checkpoint", "convert", pt, sharded, "--shard-size", "1000B")
    before = file_bytes(sharded)
    shard = sharded / next(name for name in listing(sharded) if name.startswith("model-00001-of-"))
    result = tb("checkpoint", "convert", shard, sharded, "--shard-size", "10GB")
    assert result.returncode != 0 and "is one shard of the checkpoint in OUT" in result.stderr, result.stderr
    assert file_bytes(sharded) == before
    # The whole checkpoint, through its directory or its index, still converts in place.
    index = sharded / "model.safetensors.index.json"
    assert tb("checkpoint", "convert", index, sharded, "--shard-size", "10GB").returncode == 0
    assert listing(sharded) == ["model.safetensors"]


def test_json_reports_hold_paths_and_settings_that_are_not_utf8(tmp_path):
    # JSON text is UTF-8; a file name or environment value of other bytes once made the whole
    # report fail (nlohmann's type_error 316). The invalid bytes are written as U+FFFD.
    name = tmp_path / os.fsdecode(b"caf\xe9.safetensors")
    save_file({"w": torch.ones(2)}, str(name))
    inspected = subprocess.run([CONSOLE_SCRIPT, "checkpoint", "inspect", name, "--json"], capture_output=True)
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["path"].endswith("caf\ufffd.safetensors")
    environment = dict(os.environ)
    environment = {os.fsencode(k): os.fsencode(v) for k, v in environment.items()}
    environment[b"TORCHBRIDGE_NOTE"] = b"\xff"
    doctor = subprocess.run([CONSOLE_SCRIPT, "doctor", "--json", "--backend", "cpu"], capture_output=True,
                            env=environment, timeout=300)
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["environment_overrides"]["TORCHBRIDGE_NOTE"] == "\ufffd"


def test_convert_dtype_says_how_many_values_a_narrower_dtype_lost(tmp_path):
    # float16 ends at 65504 and flushes 1e-8 to zero: the file held [inf, inf, 1, 0], said nothing.
    source, target = tmp_path / "wide.safetensors", tmp_path / "half.safetensors"
    save_file({"w": torch.tensor([1e5, 7e4, 1.0, 1e-8]), "fine": torch.ones(3)}, str(source))
    result = tb("checkpoint", "convert", source, target, "--dtype", "float16")
    assert result.returncode == 0, result.stderr
    assert ("warning: --dtype float16 turned 2 finite values into infinities and 1 nonzero values into zeros, in 1 "
            "tensor (first: 'w')") in result.stderr
    assert load_file(str(target))["w"].tolist() == [float("inf"), float("inf"), 1.0, 0.0]  # the cast, as asked
    quiet = tb("checkpoint", "convert", source, tmp_path / "b.safetensors", "--dtype", "bfloat16")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
    # validate's spelling of the same dtype converts alike; its ways of computing are no storage dtype.
    assert tb("checkpoint", "convert", source, tmp_path / "c.safetensors", "--dtype", "bf16").returncode == 0
    assert torch.equal(load_file(str(tmp_path / "c.safetensors"))["w"], load_file(str(tmp_path / "b.safetensors"))["w"])
    for bad in ("tf32", "fp8", "int8"):
        refused = tb("checkpoint", "convert", source, tmp_path / "d.safetensors", "--dtype", bad)
        assert refused.returncode == 1 and f"unknown --dtype '{bad}'; valid: float32, float16, bfloat16, float64 " \
            "(or fp32, fp16, bf16, fp64)" in refused.stderr, refused.stderr


def test_convert_dtype_leaves_quantized_weights_and_their_scales_as_they_are(tmp_path):
    # A cast of an fp8 weight drops the scaling its stored values need; its factor cast to float16
    # loses bits. Both were cast.
    source, target = tmp_path / "quantized.safetensors", tmp_path / "half.safetensors"
    weight = (torch.randn(16, 16) * 100).to(torch.float8_e4m3fn)
    state = {"proj.weight": weight, "proj.weight_scale_inv": torch.tensor([1e-6]), "proj.bias": torch.randn(16),
             "other_scale_inv": torch.tensor([0.5])}
    save_file(state, str(source))
    result = tb("checkpoint", "convert", source, target, "--dtype", "float16")
    assert result.returncode == 0, result.stderr
    # One quantized tensor: its scale was counted as a second.
    assert "kept 1 quantized tensor(s) (float8) and their scales as they are" in result.stderr
    converted = load_file(str(target))
    assert torch.equal(converted["proj.weight"].view(torch.uint8), weight.view(torch.uint8))
    assert converted["proj.weight_scale_inv"].dtype == torch.float32
    assert converted["proj.bias"].dtype == torch.float16
    assert converted["other_scale_inv"].dtype == torch.float16  # no quantized tensor of that name


def test_inspect_shows_whole_names_and_shapes(tmp_path):
    # Names were cut at 39 characters, so q_proj.weight and q_proj.weight_scale_inv looked alike.
    path = tmp_path / "fp8.safetensors"
    names = ["model.layers.10.self_attn.q_proj.weight", "model.layers.10.self_attn.q_proj.weight_scale_inv"]
    save_file({names[0]: torch.zeros(4, 4).to(torch.float8_e4m3fn), names[1]: torch.ones(1, 1),
               "deep": torch.zeros([1] * 12)}, str(path))
    text = tb("checkpoint", "inspect", path).stdout
    assert all(f"  {name} " in text for name in names)
    assert "[" + ",".join(["1"] * 12) + "]" in text


def test_inspect_shows_control_characters_in_names_and_metadata_as_escapes(tmp_path):
    # Printed raw, a newline in a metadata value or a name forged a line of the listing.
    path = tmp_path / "forged.safetensors"
    save_file({"a\nfake  F32  [9]  36 B": torch.ones(2)}, str(path), metadata={"k": "v\n  w  F32  [9]  36 B"})
    text = tb("checkpoint", "inspect", path).stdout
    assert len(text.splitlines()) == 3, text  # the summary, one metadata line, one tensor line
    assert "  metadata k = v\\n  w  F32  [9]  36 B\n" in text and "  a\\nfake  F32  [9]  36 B " in text


def test_options_are_given_once_and_subcommands_have_help(tmp_path):
    source = tmp_path / "a.safetensors"
    save_file({"w": torch.ones(2)}, str(source))
    twice = tb("checkpoint", "convert", source, tmp_path / "b.safetensors", "--dtype", "float16", "--dtype", "bfloat16")
    assert twice.returncode != 0 and "'--dtype' is given twice ('float16' and 'bfloat16')" in twice.stderr
    assert not (tmp_path / "b.safetensors").exists()
    for command in ("inspect", "verify", "convert"):
        shown = tb("checkpoint", command, "--help")
        assert shown.returncode == 0 and "usage: torchbridge checkpoint" in shown.stdout


@pytest.mark.parametrize("backends", ["cpu,cpu", "cpu,CPU", "emu,cpu,emu"])
def test_a_backend_named_twice_is_refused(backends):
    # Every check ran four times over (cpu,cpu: 40 checks for 10).
    result = tb("validate", "--model", "builtin:mlp", "--backends", backends)
    assert result.returncode != 0 and "twice" in result.stderr and "--backends" in result.stderr


def test_validate_at_batch_size_one_on_the_cpu_is_valid():
    # The round trip compared the model with weights aliasing the reloaded file at 48 mod 64
    # bytes; oneDNN's kernels at batch 1 then differ in the last bit from 64-byte-aligned ones,
    # and the check failed 3 of 3 times: NOT VALID for a model that is.
    for model, shape in (("builtin:mlp", "1,32"), ("builtin:cnn", "1,3,2,2")):
        result = tb("validate", "--model", model, "--backends", "cpu", "--input-shape", shape)
        assert result.returncode == 0, result.stdout[-600:]


def test_portability_refuses_too_few_steps_for_its_loss_windows():
    result = tb("portability", "--steps", "10")
    assert result.returncode != 0 and "--steps '10' is not a whole number from 20 to 100000" in result.stderr


def test_outputs_that_cannot_be_written_are_refused_before_any_work(tmp_path):
    started = tb("train", "--model", "builtin:mlp", "--steps", "100000", "--save", "/nonexistent/x.safetensors")
    assert started.returncode != 0 and "directory '/nonexistent' does not exist" in started.stderr
    directory = tmp_path / "out"
    directory.mkdir()
    exported = tb("export", "--model", "builtin:mlp", "--format", "torchscript", "--output", directory)
    assert exported.returncode != 0 and "is a directory" in exported.stderr
    assert listing(tmp_path) == ["out"]  # no .partial beside it
    model = tmp_path / "mlp.pt"
    assert tb("export", "--model", "builtin:mlp", "--format", "torchscript", "--output", model).returncode == 0
    original = model.read_bytes()
    over_itself = tb("export", "--model", model, "--format", "torchscript", "--output", model)
    assert over_itself.returncode != 0 and "is the --model file itself" in over_itself.stderr
    assert model.read_bytes() == original


@pytest.mark.parametrize("zip_format", [True, False])
def test_a_torch_save_file_is_named_as_one_not_as_a_header_of_petabytes(tmp_path, zip_format):
    # Its first bytes read as "header length 578712552184433488 exceeds the format's limit".
    path = tmp_path / "weights.safetensors"  # the name users give it by mistake
    torch.save({"w": torch.ones(3)}, path, _use_new_zipfile_serialization=zip_format)
    for command in ("inspect", "verify"):
        result = tb("checkpoint", command, path)
        assert result.returncode == 1 and "exceeds the format's limit" not in result.stderr
        expected = ("is a zip archive (torch.save's format), not a safetensors file" if zip_format
                    else "is a torch.save file in the legacy format (a pickle), not a safetensors file")
        assert f"{path}: {expected}" in result.stderr, result.stderr


def test_a_device_node_fifo_or_directory_is_never_replaced_by_a_checkpoint(tmp_path):
    # The write goes to a new file renamed over the target: as root, /dev/null became a 72-byte
    # checkpoint, and a FIFO a regular file. A directory failed only after the whole file was
    # written ("rename failed: Is a directory"); an empty path with "No such file or directory".
    from torchbridge import checkpoint

    source = tmp_path / "a.safetensors"
    save_file({"w": torch.ones(4)}, str(source))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, "/dev/null"):
        result = tb("checkpoint", "convert", source, target)
        assert result.returncode == 1 and "is not a regular file (a device, FIFO or socket)" in result.stderr, \
            result.stderr
        with pytest.raises(ValueError, match="is not a regular file"):
            checkpoint.save(str(target), {"w": torch.ones(2)})
    assert stat_is_fifo(fifo) and os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    directory = tmp_path / "out"
    directory.mkdir()
    result = tb("checkpoint", "convert", source, directory)
    assert result.returncode == 1 and f"OUT '{directory}' is a directory; give --shard-size SIZE" in result.stderr
    with pytest.raises(ValueError, match=f"{directory}: is a directory; expected the path of a file to write"):
        checkpoint.save(str(directory), {"w": torch.ones(2)})
    assert listing(directory) == []
    with pytest.raises(ValueError, match="empty path: expected the path of a file to write"):
        checkpoint.save("", {"w": torch.ones(2)})


def stat_is_fifo(path):
    import stat

    return stat.S_ISFIFO(os.stat(path).st_mode)


def test_a_refused_sharded_save_leaves_no_new_directory(tmp_path):
    from torchbridge import checkpoint

    target = tmp_path / "new_checkpoint"
    with pytest.raises(ValueError, match="which safetensors cannot hold"):
        checkpoint.save(str(target), {"a": torch.ones(4), "z": torch.ones(2, dtype=torch.complex128)},
                        max_shard_size="1MB")
    assert not target.exists()


def test_an_index_that_drops_a_numbered_shard_is_refused(tmp_path):
    # The index named model-00001-of-00002 only: loading returned half the model, verify said valid.
    from torchbridge import checkpoint

    checkpoint.save(str(tmp_path), {"embed": torch.ones(300), "head": torch.ones(300)}, max_shard_size="1000B")
    index_file = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    assert sorted(set(index["weight_map"].values())) == ["model-00001-of-00002.safetensors",
                                                         "model-00002-of-00002.safetensors"]
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v.startswith("model-00001")}
    index_file.write_text(json.dumps(index))
    for command in ("verify", "inspect"):
        result = tb("checkpoint", command, tmp_path)
        assert result.returncode == 1, result.stdout
        assert "the shards are numbered 1 to 2, but the weight_map maps no tensor to shard 2 of 2" in result.stderr


def test_inspect_of_a_directory_named_with_a_slash_names_files_once_and_prints_whole_dtypes(tmp_path):
    # "ckpt//model.safetensors.index.json"; F8_E4M3FNUZ was cut to F8_E4M3F in the text table.
    from torchbridge import checkpoint

    checkpoint.save(str(tmp_path), {"a": torch.ones(300), "b": torch.ones(300)}, max_shard_size="1000B")
    listed = json.loads(tb("checkpoint", "inspect", f"{tmp_path}/", "--json").stdout)
    assert listed["index"] == f"{tmp_path}/model.safetensors.index.json"
    assert all("//" not in shard["file"] for shard in listed["shards"])
    fnuz = tmp_path / "fnuz.safetensors"
    save_file({"q": torch.zeros(4, dtype=torch.float8_e4m3fnuz)}, str(fnuz))
    assert " F8_E4M3FNUZ " in tb("checkpoint", "inspect", fnuz).stdout


def test_a_zip_that_is_not_from_torch_save_is_named_with_the_readers_whole_reason(tmp_path):
    # "not a torch.save zip archive ([enforce fail at inline_container)": cut at the '.' of the
    # reader's source file name; then its file name's NUL ended the message before the ')'.
    import numpy as np

    archive = tmp_path / "weights.npz"
    np.savez(archive, a=np.ones(3))
    result = tb("checkpoint", "convert", archive, tmp_path / "out.safetensors")
    assert result.returncode == 1
    assert f"{archive}: not a torch.save zip archive (file in archive is not in a subdirectory: a.npy)\n" \
        in result.stderr, result.stderr


def test_a_refused_torch_save_entry_is_named(tmp_path):
    # The README says refusals name the file and the entry; these two named neither entry.
    with_attribute = torch.nn.Parameter(torch.ones(3))
    with_attribute.tensor_model_parallel = True
    cases = {"layer.weight": with_attribute, "emb.sparse": torch.eye(3).to_sparse()}
    for name, value in cases.items():
        source = tmp_path / f"{name}.pt"
        torch.save({"a": torch.ones(2), name: value}, source)
        result = tb("checkpoint", "convert", source, tmp_path / "out.safetensors")
        assert result.returncode == 1 and f"(in entry '{name}')" in result.stderr, result.stderr
