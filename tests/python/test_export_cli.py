"""`torchbridge export`: built-in models and TorchScript files to TorchScript, safetensors and
ONNX, each checked here against an independent reader (torch.jit.load, the safetensors package,
onnxruntime)."""

import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime
import pytest
import torch
from safetensors.torch import load_file

import torchbridge
from torchbridge.validation import builtin_model

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")
BINARY = os.environ.get("TORCHBRIDGE_CLI_PATH")  # the C++ binary, when CTest passes it


def export(*args, program=CONSOLE_SCRIPT):
    return subprocess.run([program, "export", *args], capture_output=True, text=True, timeout=300)


def test_torchscript_export_of_a_builtin_loads_in_python_with_identical_outputs(tmp_path):
    path = tmp_path / "cnn.pt"
    run = export("--model", "builtin:cnn", "--format", "torchscript", "--output", str(path))
    assert run.returncode == 0, run.stderr
    loaded = torch.jit.load(str(path))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(), torch.jit.optimized_execution(False):
        assert torch.equal(loaded(x), builtin_model("cnn")(x))


@pytest.mark.parametrize("layer", ["batch_norm", "dropout"])
def test_a_model_scripted_in_training_mode_is_written_as_given_and_verified_in_eval_mode(tmp_path, layer):
    # The verification once ran the model in the mode it was saved in: batch norm's running
    # statistics were updated by the random sample and written so, dropout failed a correct export.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4),
                                torch.nn.BatchNorm1d(4) if layer == "batch_norm" else torch.nn.Dropout(0.5))
    source, output = tmp_path / "model.pt", tmp_path / "exported.pt"
    torch.jit.script(model).save(str(source))  # model.training is True
    run = export("--model", str(source), "--format", "torchscript", "--output", str(output), "--input-shape", "8,4")
    assert run.returncode == 0, run.stderr
    given, written = torch.jit.load(str(source)), torch.jit.load(str(output))
    assert written.training
    assert written.state_dict().keys() == given.state_dict().keys()
    for name, value in given.state_dict().items():
        assert torch.equal(written.state_dict()[name], value), name
    assert sorted(os.listdir(tmp_path)) == ["exported.pt", "model.pt"]


def test_safetensors_export_reads_back_in_the_safetensors_package(tmp_path):
    path = tmp_path / "transformer.safetensors"
    run = export("--model", "builtin:transformer", "--format", "safetensors", "--output", str(path))
    assert run.returncode == 0, run.stderr
    tensors = load_file(str(path))
    expected = dict(builtin_model("transformer").named_parameters())
    assert set(tensors) == set(expected)
    assert all(torch.equal(tensors[name], value.detach()) for name, value in expected.items())


class TiedHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.out = torch.nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x):
        return self.out(x)


def test_safetensors_export_stores_tied_weights_once_as_the_python_exporter_does(tmp_path):
    # The C++ writer refused them ("share storage"), though validation and the Python export take them.
    scripted = tmp_path / "tied.pt"
    torch.jit.script(TiedHead()).save(str(scripted))
    path = tmp_path / "tied.safetensors"
    run = export("--model", str(scripted), "--format", "safetensors", "--output", str(path))
    assert run.returncode == 0, run.stderr
    assert "1 tied weights stored once" in run.stdout
    from safetensors import safe_open
    with safe_open(str(path), "pt") as file:
        assert list(file.keys()) == ["embed.weight"]
        assert json.loads(file.metadata()["torchbridge.tied_weights"]) == {"out.weight": "embed.weight"}
    assert torch.equal(load_file(str(path))["embed.weight"], torch.jit.load(str(scripted)).embed.weight.detach())


class TwoOutputs(torch.nn.Module):
    def forward(self, x):
        y = torch.nn.functional.relu(x)
        return y, [torch.log(-y - 1), x.argmax(-1)]  # a tuple holding a list; the log is all NaN


def test_torchscript_export_takes_tuples_lists_and_nan_outputs(tmp_path):
    # The verification compared one tensor (a tuple was refused) with at::equal, where NaN != NaN.
    scripted = tmp_path / "two.pt"
    torch.jit.script(TwoOutputs()).save(str(scripted))
    path = tmp_path / "out.pt"
    run = export("--model", str(scripted), "--format", "torchscript", "--output", str(path), "--input-shape", "3,5")
    assert run.returncode == 0, run.stderr
    y, (nan, argmax) = torch.jit.load(str(path))(torch.randn(3, 5))
    assert nan.isnan().all() and argmax.dtype == torch.int64


def test_the_python_front_end_refuses_what_the_binary_refuses(tmp_path):
    scripted = tmp_path / "mlp.pt"
    torch.jit.script(torch.nn.Linear(4, 3)).save(str(scripted))
    before = scripted.read_bytes()
    # --output the model itself: the exported program replaced the TorchScript file.
    run = export("--model", str(scripted), "--format", "exported", "--output", str(scripted), "--input-shape", "2,4")
    assert run.returncode == 1 and "is the --model file itself" in run.stderr, run.stderr
    assert scripted.read_bytes() == before
    # An option given twice: the last one won silently.
    run = export("--model", str(scripted), "--format", "onnx", "--format", "exported", "--output",
                 str(tmp_path / "m.pt2"), "--input-shape", "2,4")
    assert run.returncode == 1 and "'--format' is given twice" in run.stderr, run.stderr
    assert not (tmp_path / "m.pt2").exists()


def test_onnx_export_runs_in_onnxruntime_like_torch(tmp_path):
    path = tmp_path / "mlp.onnx"
    run = export("--model", "builtin:mlp", "--format", "onnx", "--output", str(path))
    assert run.returncode == 0, run.stderr
    assert "verified in onnxruntime" in run.stdout
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(16, 32)
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        expected = builtin_model("mlp")(x).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("format_, name", [("onnx", "x.onnx"), ("torchscript", "x.pt")])
def test_a_sample_that_does_not_fit_is_reported_with_torchs_own_cause(tmp_path, format_, name):
    # Only the first line was printed: "... failed in the TorchScript interpreter.", no cause
    # (the torchscript format, through the C++ command line, until 2026-11-29).
    run = export("--model", "builtin:mlp", "--format", format_, "--output", str(tmp_path / name),
                 "--input-shape", "4,31")
    assert run.returncode == 1
    assert "mat1 and mat2 shapes cannot be multiplied (4x31 and 32x64)" in run.stderr, run.stderr
    assert not (tmp_path / name).exists()


def test_a_torchscript_file_exports_to_onnx_with_its_input_shape(tmp_path):
    scripted = tmp_path / "net.pt"
    torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())).save(str(scripted))
    missing = export("--model", str(scripted), "--format", "onnx", "--output", str(tmp_path / "n.onnx"))
    assert missing.returncode == 1 and "--input-shape" in missing.stderr
    run = export("--model", str(scripted), "--format", "onnx", "--output", str(tmp_path / "n.onnx"),
                 "--input-shape", "2,4")
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("args, message", [
    (["--model", "builtin:mlp", "--format", "tflite", "--output", "x"], "--format 'tflite' is not one of"),
    (["--model", "builtin:vit", "--format", "safetensors", "--output", "x"], "unknown built-in model 'vit'"),
    (["--model", "builtin:mlp", "--format", "onnx", "--output", "/nonexistent/dir/m.onnx"], "does not exist"),
    (["--model", "builtin:mlp", "--format", "safetensors"], "export needs --output"),
    (["--model", "builtin:mlp", "--format", "safetensors", "--output", "x", "--input-shape", "2,32"],
     "--input-shape is not used by --format safetensors"),
    # A trailing ';' is an empty second shape, not one input (the C++ parser dropped it).
    (["--model", "builtin:mlp", "--format", "torchscript", "--output", "x", "--input-shape", "2,32;"],
     "--input-shape '2,32;': input shape '' is not a comma-separated list of positive integers"),
    (["--model", "builtin:mlp", "--format", "onnx", "--output", "x", "--input-shape", "2,32;"],
     "input shape '' is not a comma-separated list of positive integers"),
])
def test_bad_input_exits_1_with_a_clear_error(args, message):
    run = export(*args)
    assert run.returncode == 1
    assert message in run.stderr


@pytest.mark.skipif(BINARY is None, reason="the C++ binary's path comes from CTest (TORCHBRIDGE_CLI_PATH)")
def test_the_cpp_binary_says_onnx_needs_python(tmp_path):
    run = export("--model", "builtin:mlp", "--format", "onnx", "--output", str(tmp_path / "m.onnx"), program=BINARY)
    assert run.returncode == 1
    assert "needs torch.onnx, which only Python has" in run.stderr


class ShiftsItsInputInPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x.sub_(0.5))


@pytest.mark.parametrize("program", [CONSOLE_SCRIPT, BINARY] if BINARY else [CONSOLE_SCRIPT])
def test_torchscript_export_of_a_model_that_changes_its_input_and_of_a_shape_that_does_not_fit(tmp_path, program):
    # Both runs got one input tensor, which the first changed: "the reloaded TorchScript module's
    # outputs differ from the model's; nothing written". A wrong --input-shape gave torch's error
    # alone ("mat1 and mat2 shapes cannot be multiplied"), naming no shape.
    model = tmp_path / "shifts.pt"
    torch.jit.save(torch.jit.script(ShiftsItsInputInPlace()), str(model))
    written = export("--model", model, "--format", "torchscript", "--output", tmp_path / "out.pt", "--input-shape",
                     "4,8", program=program)
    assert written.returncode == 0, written.stderr
    x = torch.randn(4, 8)
    assert torch.equal(torch.jit.load(str(tmp_path / "out.pt"))(x.clone()), torch.jit.load(str(model))(x.clone()))
    refused = export("--model", model, "--format", "torchscript", "--output", tmp_path / "bad.pt", "--input-shape",
                     "4,7", program=program)
    assert refused.returncode == 1 and "the model does not run on random inputs of shape [4, 7] (--input-shape): " \
        "RuntimeError: " in refused.stderr, refused.stderr
    assert not (tmp_path / "bad.pt").exists()
