"""O2's compilation for C++ programs: an AOTInductor package compiled by torch in Python, loaded
and run through UnifiedManager::load_compiled (tests/cpp/compiled_model_interop.cpp). Reference:
the eager model's outputs. Bad input (wrong count, wrong shape, a level below O2, a missing file)
must be an error message and exit status 1, never a crash."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

INTEROP = os.environ.get("TORCHBRIDGE_COMPILED_MODEL_INTEROP",
                         str(Path(__file__).resolve().parents[2] / "build" / "bin" / "compiled_model_interop"))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    example = torch.randn(3, 8)
    path = tmp_path_factory.mktemp("aoti") / "model.pt2"
    torch._inductor.aoti_compile_and_package(torch.export.export(model, (example,)), package_path=str(path))
    return model, example, path


def run(package_path, inputs, tmp_path, level="O2"):
    save_file({f"input{i}": t.contiguous() for i, t in enumerate(inputs)}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    result = subprocess.run([INTEROP, str(package_path), str(tmp_path / "in.safetensors"), str(out), level],
                            capture_output=True, text=True, timeout=300)
    return result, (load_file(str(out)) if result.returncode == 0 else None)


def test_a_package_runs_from_cpp_with_the_eager_models_outputs(package, tmp_path):
    model, example, path = package
    result, outputs = run(path, [example], tmp_path)
    assert result.returncode == 0, result.stderr
    with torch.no_grad():
        expected = model(example)
    torch.testing.assert_close(outputs["output0"], expected, rtol=1e-5, atol=1e-6)
    report = json.loads(result.stdout)
    assert report["level"] == "O2" and report["device"] == "cpu"
    [step] = report["steps"]
    assert step["name"] == "compile" and step["outcome"] == "applied" and "(1 input tensor(s))" in step["detail"]


@pytest.mark.parametrize("inputs,messages", [
    (lambda x: [x, x.clone()], ["takes 1 input tensor(s), got 2"]),
    (lambda x: [torch.randn(3, 5)], ["refused its inputs", "input_handles[0]: unmatched dim value at 1, expected: 8, "
                                                           "but got: 5"]),
    (lambda x: [x.double()], ["refused its inputs", "input_handles[0]: unmatched dtype"]),
])
def test_bad_inputs_are_errors_not_crashes(package, tmp_path, inputs, messages):
    # The reason is in our error on torch 2.13; torch 2.11's AOTInductor runtime prints it to stderr
    # itself ("Error: input_handles[0]: ...") and throws a generic error (seen on the H100 machine).
    _, example, path = package
    result, _ = run(path, inputs(example), tmp_path)
    assert result.returncode == 1, (result.returncode, result.stderr)
    for message in messages:
        assert message in result.stderr


def test_below_o2_and_a_missing_file_are_refused(package, tmp_path):
    _, example, path = package
    result, _ = run(path, [example], tmp_path, level="O1")
    assert result.returncode == 1 and "compilation is an O2 step, and the configuration's optimization_level is O1" \
        in result.stderr
    result, _ = run(tmp_path / "missing.pt2", [example], tmp_path)
    assert result.returncode == 1 and "does not exist or is not a file" in result.stderr
