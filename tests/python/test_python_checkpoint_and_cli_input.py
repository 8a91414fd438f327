"""Review findings in the Python package, each checked against an independent reference: what
checkpoint.save writes (read back by the `safetensors` package), its argument checks, the device
map of load_training_state, failed exports leaving an earlier file alone (onnxruntime and
torch.jit.load read it back), and the one-line errors of `torchbridge run -m` and `export`."""

import json
import os
import subprocess
import sys

import onnxruntime
import pytest
import torch
from safetensors.torch import load_file

from torchbridge import checkpoint
from torchbridge.deployment import (ExportVerificationError, export_to_onnx, export_to_safetensors,
                                    export_to_torchscript)

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def cli(*args, cwd=None):
    env = dict(os.environ, TORCHBRIDGE_BACKEND="cpu")
    return subprocess.run([CONSOLE_SCRIPT, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


# ---- checkpoint.save: conjugate and negative views --------------------------------------------------
def test_save_writes_conjugate_and_negative_views_as_the_values_they_hold(tmp_path):
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    x = torch.tensor([1.0, 2.0])
    # Views that carry a conj/neg bit over unchanged storage: the bytes alone are the base's values.
    views = {"zc": z.conj(), "neg": x._neg_view(), "neg_conj": z.clone().conj()._neg_view()}
    assert views["zc"].is_conj() and views["neg"].is_neg()
    path = tmp_path / "views.safetensors"
    checkpoint.save(path, views)
    theirs = load_file(str(path))  # the reference reader
    assert torch.equal(theirs["zc"], torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))
    assert torch.equal(theirs["neg"], torch.tensor([-1.0, -2.0]))
    assert torch.equal(theirs["neg_conj"], torch.tensor([-1 + 2j, -3 - 4j], dtype=torch.complex64))
    ours = checkpoint.load(path)
    assert all(torch.equal(ours[name], theirs[name]) for name in views)


class NegativeBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.register_buffer("shift", torch.tensor([1.0, 2.0])._neg_view())


def test_export_to_safetensors_of_a_negative_view_buffer_stores_its_values(tmp_path):
    # The export's bit-for-bit check read the view's bytes through Tensor.view(uint8), which torch
    # refuses for a tensor with the negative bit set.
    model = NegativeBuffer()
    result = export_to_safetensors(model, tmp_path / "m.safetensors")
    theirs = load_file(result.path)
    assert torch.equal(theirs["shift"], torch.tensor([-1.0, -2.0]))
    assert all(torch.equal(theirs[name], value) for name, value in model.state_dict().items())


def test_export_to_safetensors_does_not_tie_a_negative_view_to_the_tensor_it_views(tmp_path):
    # Same storage, offset, shape and strides, but other values: recording 'minus' as an alias of
    # 'plus' would load it back with the wrong sign. Overlapping tensors are refused instead.
    model = torch.nn.Module()
    plus = torch.tensor([1.0, 2.0])
    model.register_buffer("plus", plus)
    model.register_buffer("minus", plus._neg_view())
    with pytest.raises(ValueError, match="tensors 'plus' and 'minus' share storage"):
        export_to_safetensors(model, tmp_path / "m.safetensors")


# ---- checkpoint.save: argument checks ---------------------------------------------------------------
@pytest.mark.parametrize("tensors, options, error, message", [
    ({"a": 3}, {}, TypeError, r"tensors\['a'\] must be a torch.Tensor, got int"),
    ([torch.ones(1)], {}, TypeError, "tensors must be a dict of str to torch.Tensor, got list"),
    ({1: torch.ones(1)}, {}, TypeError, r"tensor names must be str, got 1 \(int\)"),
    ({"a": torch.ones(1)}, {"metadata": {"k": 1}}, TypeError, "metadata must map str to str .*got 'k': 1"),
    ({"a": torch.ones(1)}, {"metadata": {2: "v"}}, TypeError, "metadata must map str to str .*got 2: 'v'"),
    ({"a": torch.ones(1)}, {"metadata": "k=v"}, TypeError, "metadata must be None or a dict of str to str, got str"),
    ({"a": torch.ones(1)}, {"max_shard_size": -5}, ValueError, "max_shard_size: invalid size -5: must be positive"),
    ({"a": torch.ones(1)}, {"max_shard_size": 0}, ValueError, "max_shard_size: invalid size 0: must be positive"),
    ({"a": torch.ones(1)}, {"max_shard_size": "0"}, ValueError, "max_shard_size: invalid size '0': must be positive"),
    ({"a": torch.ones(1)}, {"max_shard_size": 2**64}, ValueError, "more than 2\\^64 bytes"),
    ({"a": torch.ones(1)}, {"max_shard_size": 1.5}, TypeError, "max_shard_size must be None .* got 1.5"),
    ({"a": torch.ones(1)}, {"max_shard_size": True}, TypeError, "max_shard_size must be None .* got True"),
    # These reached pybind's "incompatible function arguments", or failed in DLPack naming no tensor.
    ({"w\udcff": torch.ones(1)}, {}, ValueError, "tensor name 'w\\\\udcff' is not valid UTF-8 text"),
    ({"a": torch.ones(1)}, {"metadata": {"k": "\udcff"}}, ValueError, "metadata\\['k'\\] '\\\\udcff' is not valid UTF-8"),
    ({"s": torch.eye(2).to_sparse()}, {}, ValueError, "tensors\\['s'\\] is a torch.sparse_coo tensor; safetensors holds "
                                                       "dense"),
    ({"m": torch.ones(1, device="meta")}, {}, ValueError, "tensors\\['m'\\] is on the meta device"),
    ({"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)}, {}, ValueError,
     "tensors\\['q'\\] is a quantized torch.qint8 tensor"),
])
def test_save_refuses_bad_arguments_by_name_and_writes_nothing(tmp_path, tensors, options, error, message):
    target = tmp_path / "out"
    with pytest.raises(error, match=message):
        checkpoint.save(target, tensors, **options)
    # max_shard_size=0 used to write one unsharded file at the path meant for a directory.
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_a_json_name_which_would_replace_a_sharded_checkpoints_index(tmp_path):
    checkpoint.save(tmp_path, {"a": torch.ones(4), "b": torch.ones(4)}, max_shard_size=16)
    index = tmp_path / "model.safetensors.index.json"
    with pytest.raises(ValueError, match="names a JSON file; a single safetensors file needs another name"):
        checkpoint.save(index, {"a": torch.zeros(4)})
    assert json.loads(index.read_text())["weight_map"] == {"a": "model-00001-of-00002.safetensors",
                                                           "b": "model-00002-of-00002.safetensors"}


def test_loading_refuses_what_the_core_cannot_take_as_python_libraries_do(tmp_path):
    missing = tmp_path / "missing.safetensors"
    for read in (checkpoint.load, checkpoint.metadata, checkpoint.names):
        with pytest.raises(FileNotFoundError, match="No such file or directory"):
            read(missing)
    path = checkpoint.save(tmp_path / "w.safetensors", {"w": torch.ones(2)})[0]
    with pytest.raises(TypeError, match=r"names must be tensor names \(str\), got 1 \(int\)"):
        checkpoint.load(path, names=[1])
    undecodable = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9.safetensors")
    with pytest.raises(ValueError, match="is not valid UTF-8 text .*checkpoints take UTF-8 file names"):
        checkpoint.save(undecodable, {"w": torch.ones(2)})


def test_an_empty_tensor_name_reads_and_writes_as_the_safetensors_package_does(tmp_path):
    # The package writes and reads "" as a name; the reader refused such a file ("a tensor has an
    # empty name") and the writer refused to make one.
    from safetensors.torch import save_file

    theirs = tmp_path / "theirs.safetensors"
    save_file({"": torch.arange(3.0), "b": torch.ones(2)}, str(theirs))
    loaded = checkpoint.load(theirs)
    assert loaded.keys() == {"", "b"} and torch.equal(loaded[""], torch.arange(3.0))
    ours = tmp_path / "ours.safetensors"
    checkpoint.save(ours, {"": torch.arange(4.0)})
    assert torch.equal(load_file(str(ours))[""], torch.arange(4.0))
    verify = subprocess.run([CONSOLE_SCRIPT, "checkpoint", "verify", str(theirs)], capture_output=True, text=True,
                            timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.parametrize("path", [None, 3, b"bytes.safetensors"])
def test_every_checkpoint_function_refuses_a_path_that_is_not_one(tmp_path, monkeypatch, path):
    # str(None) named a file "None" in the working directory: save wrote it, load read it.
    monkeypatch.chdir(tmp_path)
    for call in (lambda: checkpoint.save(path, {"a": torch.ones(1)}), lambda: checkpoint.load(path),
                 lambda: checkpoint.names(path), lambda: checkpoint.metadata(path),
                 lambda: checkpoint.save_training_state(path, torch.nn.Linear(1, 1))):
        with pytest.raises(TypeError, match=f"path must be a str or os.PathLike, got {type(path).__name__}"):
            call()
    assert list(tmp_path.iterdir()) == []


def test_save_takes_a_size_in_bytes_as_an_int_like_the_same_size_as_a_string(tmp_path):
    tensors = {f"w{i}": torch.randn(32, 32) for i in range(4)}  # 4096 bytes each
    as_int = checkpoint.save(tmp_path / "int", tensors, max_shard_size=9000)
    as_str = checkpoint.save(tmp_path / "str", tensors, max_shard_size="9KB")
    assert [os.path.relpath(p, tmp_path / "int") for p in as_int] == [os.path.relpath(p, tmp_path / "str")
                                                                       for p in as_str]
    assert len(as_int) == 3  # two shards and the index
    theirs = {}
    for path in as_int[:-1]:
        theirs.update(load_file(path))
    assert theirs.keys() == tensors.keys() and all(torch.equal(theirs[n], t) for n, t in tensors.items())


# ---- load_training_state: device map -----------------------------------------------------------------
def make_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_a_device_map_entry_that_matches_nothing_is_an_error_naming_it(tmp_path):
    path = checkpoint.save_training_state(tmp_path / "s.safetensors", make_net())
    restored = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    before = {name: t.clone() for name, t in restored.state_dict().items()}
    for typo in ("nothere", "0.wieght", "22"):
        with pytest.raises(ValueError, match=rf"device_map\['{typo}'\] matches no module or tensor of the model; "
                                             r"prefixes are module paths such as '0', '1', '2'"):
            checkpoint.load_training_state(path, restored, device_map={"": "cpu", typo: "cpu"})
    assert all(torch.equal(restored.state_dict()[name], t) for name, t in before.items())  # nothing loaded


def test_device_map_prefixes_that_name_a_module_or_tensor_still_load(tmp_path):
    saved = make_net()
    path = checkpoint.save_training_state(tmp_path / "s.safetensors", saved)
    restored = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    # A module, a module with no tensors (the ReLU), a tensor, a trailing-dot prefix and "".
    checkpoint.load_training_state(path, restored,
                                   device_map={"": "cpu", "0": "cpu", "1": "cpu", "2.bias": "cpu", "2.": "cpu"})
    assert all(torch.equal(restored.state_dict()[name], t) for name, t in saved.state_dict().items())


# ---- failed exports leave an earlier file alone ------------------------------------------------------
def test_a_failed_onnx_export_leaves_the_earlier_file_and_no_partial_file(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 32)
    earlier_model = torch.nn.Linear(32, 32)  # another model, so the earlier file differs from the new one
    good = export_to_onnx(earlier_model, output_path=tmp_path / "good.onnx", sample_input=x)
    earlier = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(earlier) == {"good.onnx", "good.onnx.data"}  # the exporter keeps weights beside the graph
    # With no tolerance at all, onnxruntime's attention/LayerNorm kernels differ from PyTorch's
    # somewhere in float32: the new file fails its check.
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    with pytest.raises(ExportVerificationError, match="onnxruntime at batch size 2 differs from the model"):
        export_to_onnx(layer, output_path=tmp_path / "good.onnx", sample_input=x, rtol=0.0, atol=0.0)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == earlier
    # The earlier export still runs in onnxruntime as the earlier model.
    session = onnxruntime.InferenceSession(good.path, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), earlier_model(x), rtol=1e-4, atol=1e-5)


def test_an_export_without_external_weights_removes_the_earlier_exports_weights(tmp_path):
    # An eager model's export keeps its weights in m.onnx.data; a TorchScript model's (torch's
    # older exporter) holds them inline. The earlier .data stayed beside the new file, stale.
    from torchbridge.validation import builtin_model
    x = torch.randn(16, 32)
    export_to_onnx(torch.nn.Linear(32, 10), output_path=tmp_path / "m.onnx", sample_input=x)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    model = builtin_model("mlp")
    export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(x), rtol=1e-4, atol=1e-5)


def test_a_failed_torchscript_export_leaves_the_earlier_file(tmp_path):
    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)  # a new draw on every call: the file cannot reproduce it

    target = tmp_path / "n.pt"
    target.write_bytes(b"an earlier export")
    with pytest.raises(ExportVerificationError, match="the TorchScript file differs from the model"):
        export_to_torchscript(Noisy(), output_path=target, sample_input=torch.zeros(3), method="script")
    assert target.read_bytes() == b"an earlier export"
    assert [p.name for p in tmp_path.iterdir()] == ["n.pt"]


# ---- the console script: one clear line, non-zero exit -----------------------------------------------
@pytest.mark.parametrize("module", ["no_such_module_here", "no_such_package.module", "json"])
def test_run_of_a_module_python_cannot_find_is_one_line_like_python_dash_m(tmp_path, module):
    # python -m prints "<python>: <reason>"; run prints the same reason after its own prefix.
    python = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, cwd=tmp_path)
    assert python.returncode == 1 and len(python.stderr.splitlines()) == 1
    reason = python.stderr.strip().split(": ", 1)[1]  # after "<the interpreter's path>: "
    run = cli("run", "-m", module, cwd=tmp_path)
    assert run.returncode == 1
    assert run.stderr.splitlines() == [f"torchbridge: run: {reason}"]


def test_run_module_still_runs_and_reports_the_modules_own_import_error(tmp_path):
    (tmp_path / "hello.py").write_text("import sys\nprint('hello', sys.argv[1:])\n")
    (tmp_path / "broken.py").write_text("import no_such_dependency_here\n")
    hello = cli("run", "-m", "hello", "a", cwd=tmp_path)
    assert hello.returncode == 0 and hello.stdout == "hello ['a']\n", hello.stderr
    # The module was found; its own failure is the program's error, reported as Python would.
    broken = cli("run", "-m", "broken", cwd=tmp_path)
    assert broken.returncode == 1 and "Traceback" in broken.stderr
    assert "ModuleNotFoundError: No module named 'no_such_dependency_here'" in broken.stderr


@pytest.mark.parametrize("export_format, name", [("exported", "m.pt2"), ("onnx", "m.onnx")])
def test_export_that_cannot_write_its_output_is_one_line_naming_the_path(tmp_path, export_format, name):
    # /proc takes no new files (for root too); a name past NAME_MAX fails in a writable directory.
    for output in (f"/proc/{name}", str(tmp_path / ("x" * 300 + name))):
        run = cli("export", "--model", "builtin:mlp", "--format", export_format, "--output", output)
        assert run.returncode == 1
        lines = run.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("torchbridge: ") and output in lines[0], run.stderr
        assert not os.path.exists(output)
    assert list(tmp_path.iterdir()) == []


# ---- the command line: output and configuration files ----------------------------------------
def test_output_the_command_could_not_write_is_a_failure():
    # With standard output on a full disk the command lost its JSON and still exited 0.
    with open("/dev/full", "w") as full:
        result = subprocess.run([CONSOLE_SCRIPT, "info", "--json"], stdout=full, stderr=subprocess.PIPE, text=True,
                                timeout=120)
    assert result.returncode == 1 and "writing to standard output failed" in result.stderr, result.stderr


def test_a_configuration_path_that_is_a_directory_is_named(tmp_path):
    # It gave libstdc++'s "basic_filebuf::underflow error reading the file: Is a directory".
    result = subprocess.run([CONSOLE_SCRIPT, "info", "--config", str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert f"configuration file '{tmp_path}' is a directory; expected a .json or .toml file" in result.stderr


def test_the_console_script_runs_with_standard_output_closed(tmp_path):
    # sys.stdout is None then: the console script raised AttributeError ('NoneType' object has no
    # attribute 'flush') instead of the command's own error, and `run` did the same after the program.
    closed = subprocess.run([CONSOLE_SCRIPT, "info", "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, timeout=120, preexec_fn=lambda: os.close(1))
    assert closed.returncode == 1 and "writing to standard output failed" in closed.stderr, closed.stderr
    assert "Traceback" not in closed.stderr
    (tmp_path / "program.py").write_text("print('lost, as with plain python')\n")
    program = subprocess.run([CONSOLE_SCRIPT, "run", str(tmp_path / "program.py")], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1))
    assert program.returncode == 0 and "Traceback" not in program.stderr, program.stderr


def test_export_names_an_empty_output_option():
    result = subprocess.run([CONSOLE_SCRIPT, "export", "--model", "builtin:mlp", "--format", "onnx", "--output", ""],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "--output is empty; expected the path of the file to write" in result.stderr

