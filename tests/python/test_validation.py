"""Cross-backend validation: UnifiedValidator on Python and TorchScript models, `torchbridge
validate`, and the faulty emu variants the checks must catch."""

import json
import os
import subprocess
import sys

import pytest
import torch

import torchbridge
from torchbridge import UnifiedValidator
from torchbridge.validation import builtin_model

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")

# Loaded before this process's first backward pass, as PyTorch requires of a new device.
VALIDATOR = UnifiedValidator(backends=["cpu", "emu"])

# A native accelerator this machine lacks, for the "not available" errors: cuda on the CPU machine,
# another vendor's on a GPU machine (where cuda validates).
UNAVAILABLE = next(name for name in ("cuda", "rocm", "xpu", "mps")
                   if name not in torchbridge.BackendFactory.available_backends())


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class DeviceDependent(torch.nn.Module):
    """Computes something slightly different off the CPU: the kind of bug validation is for."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        return y if y.device.type == "cpu" else y * 1.001


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x) + 1e-3 * torch.rand_like(x[:, :4])


def checks(result, backend, check):
    return [c for c in result.checks if c["backend"] == backend and c["check"] == check]


def test_python_module_is_valid_on_cpu_and_emu():
    torch.manual_seed(0)
    model = SmallNet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = VALIDATOR.validate_model(model, input_shape=(5, 8))
    assert result.is_valid and result.passed == result.total_tests, str(result)
    # one output, four gradients, finite, determinism, round trip per backend; memory on emu
    assert result.total_tests == 2 * 8 + 1
    for backend in ("cpu", "emu"):
        grads = checks(result, backend, "gradient")
        assert sorted(c["subject"] for c in grads) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
        for c in grads + checks(result, backend, "output"):
            assert c["rel_l2_error"] < 1e-6 and c["cosine_similarity"] > 0.999999
    assert checks(result, "emu", "memory")[0]["passed"]
    assert any("cpu: memory" in line for line in result.not_checked)
    # the source model was neither moved nor changed
    assert all(torch.equal(before[k], v) and v.device.type == "cpu" for k, v in model.state_dict().items())


def test_a_model_that_lives_on_the_device_validates_with_exact_memory_figures():
    """What `portability` does after training: the source model is on the device being validated.
    Every copy, the float64 reference's included, is made from the device; the memory windows must
    still balance and the source must stay where it is. (On an H200 the reference's copy, then made
    on the reference's own thread, fell into cuda's window; Validator.ComputesTheReferenceWhileThe
    BackendRuns checks the thread it is made on.)"""
    torch.manual_seed(0)
    model = SmallNet().to("emu")
    before = {k: v.cpu() for k, v in model.state_dict().items()}
    for _ in range(3):
        result = VALIDATOR.validate_model(model, input_shape=(64, 8))
        assert result.is_valid and result.passed == result.total_tests, str(result)
        assert checks(result, "emu", "memory")[0]["passed"]
    assert all(v.device.type == "emu" and torch.equal(before[k], v.cpu()) for k, v in model.state_dict().items())


def test_reported_errors_match_an_independent_computation():
    torch.manual_seed(1)
    model = SmallNet()
    x = torch.randn(5, 8)
    result = VALIDATOR.validate_model(model, inputs=[x], dtype="bf16")
    assert result.is_valid, str(result)
    # Recompute the cpu output error ourselves: bf16 model on bf16-rounded input vs float64.
    rounded = x.to(torch.bfloat16).float()
    reference_model = SmallNet()
    reference_model.load_state_dict(model.state_dict())
    reference = reference_model.to(torch.bfloat16).double()(rounded.double()).detach()
    low = model.to(torch.bfloat16)(rounded.to(torch.bfloat16)).detach().double()
    (output,) = checks(result, "cpu", "output")
    assert output["max_abs_error"] == pytest.approx((low - reference).abs().max().item(), rel=1e-9)
    assert output["rel_l2_error"] == pytest.approx(((low - reference).norm() / reference.norm()).item(), rel=1e-9)


def test_torchscript_modules_traced_and_builtin():
    torch.manual_seed(2)
    traced = torch.jit.trace(SmallNet(), torch.randn(2, 8))
    assert VALIDATOR.validate_model(traced, input_shape=(3, 8)).is_valid
    transformer = builtin_model("transformer")
    shape = tuple(torchbridge._C.builtin_model_input_shape("transformer"))
    result = VALIDATOR.validate_model(transformer, input_shape=shape, dtype="fp16")
    assert result.is_valid, str(result)
    assert result.reference == "cpu float64"


def test_a_device_dependent_model_fails_the_output_check():
    result = VALIDATOR.validate_model(DeviceDependent(), input_shape=(4, 8))
    assert not result.is_valid
    assert checks(result, "cpu", "output")[0]["passed"]
    (emu_output,) = checks(result, "emu", "output")
    assert not emu_output["passed"]
    assert emu_output["max_rel_error"] == pytest.approx(1e-3, rel=0.05)


def test_a_nondeterministic_model_fails_the_determinism_check():
    result = VALIDATOR.validate_model(Noisy(), input_shape=(4, 8))
    assert not result.is_valid
    assert not checks(result, "cpu", "determinism")[0]["passed"]
    assert not checks(result, "emu", "determinism")[0]["passed"]


@pytest.mark.parametrize("kwargs, message", [
    ({"input_shape": (4, 9)}, "does not run on the CPU with inputs of shape [4, 9]"),
    ({"input_shape": (4, 0)}, "must be positive integers"),
    ({"input_shape": (4, 8), "inputs": [torch.zeros(4, 8)]}, "exactly one of"),
    ({"input_shape": (4, 8), "dtype": "int8"}, "cannot be validated"),
    ({"inputs": [torch.zeros(4, 8, device="emu")]}, "inputs must be CPU tensors, got a tensor on emu:0"),
])
def test_bad_input_raises_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        VALIDATOR.validate_model(SmallNet(), **kwargs)


class ShiftsItsInputInPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x.sub_(0.5).div_(2.0))


def test_a_model_that_changes_its_input_in_place_validates_and_leaves_the_callers_tensor():
    # Every run got the caller's tensor: each shifted it again, correct backends failed against
    # the reference (2/6 checks on the CPU against itself), and the caller's input changed.
    x = torch.randn(4, 8)
    before = x.clone()
    result = VALIDATOR.validate_model(ShiftsItsInputInPlace(), inputs=[x])
    assert result.is_valid, result.failures
    assert torch.equal(x, before)
    leaky = torch.nn.Sequential(torch.nn.LeakyReLU(0.1, inplace=True), torch.nn.Linear(8, 8))
    assert UnifiedValidator(backends=["cpu"]).validate_model(leaky, input_shape=(4, 8)).is_valid
    scripted = torch.jit.script(ShiftsItsInputInPlace())
    assert VALIDATOR.validate_model(scripted, inputs=[x]).is_valid and torch.equal(x, before)


class DiffersOnTheDevice(torch.nn.Module):
    """Right on the CPU; on any other device, wrong in a way only an exact or whole comparison sees."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)

    def forward(self, x):
        y = self.fc(x)
        off = x.device.type != "cpu"
        imaginary = y[:, 8:] * (1.5 if off else 1.0)
        ids = y.argmax(-1) * 1000 + (5 if off else 0)
        return torch.complex(y[:, :8], imaginary), ids


def test_complex_outputs_are_compared_whole_and_integer_outputs_exactly():
    # An imaginary part 1.5x too large, and token ids off by 5, both passed as VALID.
    result = VALIDATOR.validate_model(DiffersOnTheDevice(), input_shape=(4, 8))
    failed = {(c["backend"], c["subject"]) for c in result.failures}
    assert ("emu", "output 0") in failed and ("emu", "output 1") in failed, result.failures
    assert not any(backend == "cpu" for backend, _ in failed), result.failures
    ids = next(c for c in result.failures if c["subject"] == "output 1")
    assert ids["detail"] == "Long values compared exactly: 4 of 4 differ (largest difference 5)"
    # The gradient flows through both parts of the complex output: the wrong imaginary part is seen there too.
    assert ("emu", "fc.weight") in failed


class LinearBeforeBatchNorm(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.fc = torch.nn.Linear(features, features)
        self.bn = torch.nn.BatchNorm1d(features)

    def forward(self, x):
        return self.bn(self.fc(x))


@pytest.mark.parametrize("features, batch", [(8, 4), (64, 64), (128, 256)])
def test_a_bias_before_batch_norm_validates_on_the_cpu_against_itself(features, batch):
    # Its gradient is zero in exact arithmetic; fp32 left 7e-7 of noise where atol allowed 3e-7,
    # so the CPU failed against itself for every seed and size tried.
    for seed in range(3):
        result = UnifiedValidator(backends=["cpu"], seed=seed).validate_model(
            LinearBeforeBatchNorm(features), input_shape=(batch, features))
        assert result.is_valid, result.failures


def test_two_spellings_of_one_backend_are_refused():
    # emu and privateuseone ran every check twice on emu:0; the CLI refused the same list.
    for alias in ("privateuseone", "privateuse1"):
        with pytest.raises(ValueError, match=f"name backend 'emu' twice \\('emu' and '{alias}'\\)"):
            UnifiedValidator(backends=["emu", alias])


def test_a_precision_by_torch_dtype_or_its_name_is_the_same_precision():
    # torch.float16 and "float16" were "cannot be validated: expected one of fp64, ...".
    for spelling in (torch.float16, "float16", "fp16"):
        result = UnifiedValidator(backends=["cpu"], dtype=spelling).validate_model(SmallNet(), input_shape=(4, 8))
        assert result.precision == "fp16" and result.is_valid, spelling
    assert VALIDATOR.validate_model(SmallNet(), input_shape=(4, 8), dtype=torch.bfloat16).precision == "bf16"
    for bad in (torch.int8, torch.float8_e4m3fn, "half"):
        with pytest.raises(ValueError, match=f"dtype {bad!r} cannot be validated: expected one of fp64, fp32, bf16, "
                                             "fp16, fp8, or torch.float64"):
            UnifiedValidator(backends=["cpu"], dtype=bad)
    cli = subprocess.run([CONSOLE_SCRIPT, "validate", "--model", "builtin:mlp", "--backends", "cpu", "--dtype",
                          "bfloat16", "--json"], capture_output=True, text=True)
    assert cli.returncode == 0 and json.loads(cli.stdout)["precision"] == "bf16", cli.stderr


def test_seeds_and_shapes_of_any_integer_type_and_bad_ones_named():
    # numpy's integers were "'numpy.int64' object is not iterable"; a negative seed was the
    # binding's TypeError at validate time.
    import numpy as np

    assert UnifiedValidator(backends=["cpu"], seed=np.uint64(7)).seed == 7
    result = UnifiedValidator(backends=["cpu"]).validate_model(SmallNet(), input_shape=np.array([4, 8]))
    assert result.is_valid and checks(result, "cpu", "output")
    assert UnifiedValidator(backends=["cpu"]).validate_model(SmallNet(), input_shape=torch.Size([4, 8])).is_valid
    for seed in (-1, 2**64, 1.5, "7"):
        with pytest.raises(ValueError, match=f"seed must be an integer from 0 to 2\\*\\*64 - 1, got {seed!r}"):
            UnifiedValidator(backends=["cpu"], seed=seed)
    for shape in (4, (4, 8.0), [(4, 8), "x"]):
        with pytest.raises(ValueError, match="must be"):
            VALIDATOR.validate_model(SmallNet(), input_shape=shape)
    # A string was read character by character: "input_shape '4' must be positive integers".
    with pytest.raises(TypeError, match="input_shape must be a shape such as \\(4, 16, 32\\), not a str \\('4,8'\\)"):
        VALIDATOR.validate_model(SmallNet(), input_shape="4,8")
    with pytest.raises(TypeError, match="progress must be a function .* got int"):
        VALIDATOR.validate_model(SmallNet(), input_shape=(4, 8), progress=5)


class HoldsALock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        import threading

        self.linear, self.lock = torch.nn.Linear(8, 4), threading.Lock()

    def forward(self, x):
        return self.linear(x)


def test_a_frozen_torchscript_model_states_why_it_does_not_run_in_float64():
    # A frozen graph keeps float32 constants, so the float64 reference falls back to float32. The
    # reason shown was a line of pybind's Python stack ("validation.py(190): run"), not the error.
    frozen = torch.jit.freeze(torch.jit.script(torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()))
    result = VALIDATOR.validate_model(frozen, input_shape=(2, 8))
    assert "mat1 and mat2 must have the same dtype" in result.reference, result.reference
    assert ".py(" not in result.reference, result.reference


def test_a_model_that_cannot_be_copied_is_named_as_such():
    # It runs; the copy each backend validates could not be made ("does not run on the CPU" alone misled).
    with pytest.raises(Exception, match="the model cannot be deep-copied, which validation needs.*_thread.lock"):
        VALIDATOR.validate_model(HoldsALock(), input_shape=(2, 8))


def test_unknown_and_unavailable_backends_raise_before_any_work():
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        UnifiedValidator(backends=["cpu", "nope"])
    with pytest.raises(Exception, match="not available"):
        UnifiedValidator(backends=[UNAVAILABLE])


def test_an_sdk_device_beside_a_native_accelerator_is_refused_in_one_process():
    # PyTorch's autograd serves one accelerator per process: the names alone decide, on any machine.
    with pytest.raises(ValueError, match="cannot validate on SDK device 'emu' and native accelerator 'cuda' in one process"):
        UnifiedValidator(backends=["cpu", "cuda", "emu"])


def test_stock_modules_whose_kernels_or_gradients_tripped_the_checks_are_valid():
    # TransformerEncoderLayer in eval mode takes its fast path under no_grad, whose last bits differ:
    # the forward-only repeat ran under no_grad and was called nondeterministic (4.8e-7).
    torch.manual_seed(3)
    encoder = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    result = VALIDATOR.validate_model(encoder, input_shape=(4, 10, 32))
    assert result.is_valid, str(result)
    # The bias just before batch norm has a gradient that is zero in exact arithmetic: float64 left
    # 8.9e-16, float32 about 5e-7 pointing anywhere (cosine 0.17), within the absolute tolerance.
    normed = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                 torch.nn.Linear(32, 4))
    result = VALIDATOR.validate_model(normed, input_shape=(8, 16))
    assert result.is_valid, str(result)
    (bias,) = [c for c in checks(result, "emu", "gradient") if c["subject"] == "0.bias"]
    assert "not checked: the reference is within the absolute tolerance" in bias["detail"]
    # Attention asked for no weights returns (output, None): the tensors are compared, None left alone.
    attention = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()

    class SelfAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = attention

        def forward(self, x):
            return self.attention(x, x, x, need_weights=False)

    result = VALIDATOR.validate_model(SelfAttention(), input_shape=(2, 5, 16))
    assert result.is_valid and checks(result, "emu", "output"), str(result)
    # Determinism and the round trip measure one difference: no other metric is reported for them.
    repeats = checks(result, "emu", "determinism") + checks(result, "emu", "round_trip")
    assert repeats and all(set(c) & {"max_rel_error", "rel_l2_error", "cosine_similarity"} == set() for c in repeats)


def validate_cli(*args, env=None):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([CONSOLE_SCRIPT, "validate", *args], capture_output=True, text=True, env=full_env,
                          timeout=300)


@pytest.mark.parametrize("model", ["mlp", "cnn", "transformer"])
def test_cli_builtin_models_are_valid_with_every_value_in_json(model):
    run = validate_cli("--model", f"builtin:{model}", "--backends", "cpu,emu", "--json")
    assert run.returncode == 0, run.stderr + run.stdout
    report = json.loads(run.stdout)
    assert report["valid"] and report["passed"] == report["total_tests"] > 0
    comparisons = [c for c in report["checks"] if c["check"] in ("output", "gradient")]
    assert comparisons and all({"max_abs_error", "max_rel_error", "rel_l2_error", "cosine_similarity"} <= c.keys()
                               for c in comparisons)
    assert {row["precision"] for row in report["tolerances"]} == {"fp64", "fp32", "tf32", "fp16", "bf16", "fp8"}


@pytest.mark.parametrize("isolate", [[], ["--isolate"]])
def test_cli_checkpointed_training_validates_the_recomputed_backward(isolate):
    run = validate_cli("--model", "builtin:transformer", "--backends", "cpu,emu", "--checkpointing", "--json", *isolate)
    assert run.returncode == 0, run.stderr + run.stdout
    report = json.loads(run.stdout)
    assert report["checkpointing"] is True and report["valid"]
    gradients = [c for c in report["checks"] if c["check"] == "gradient"]
    assert {c["backend"] for c in gradients} == {"cpu", "emu"}
    table = validate_cli("--model", "builtin:mlp", "--backends", "cpu", "--checkpointing")
    assert table.returncode == 0 and "with checkpointed training" in table.stdout


def test_cli_human_table_and_exit_code():
    run = validate_cli("--model", "builtin:mlp", "--backends", "cpu,emu", "--dtype", "bf16")
    assert run.returncode == 0, run.stderr
    assert "Result:" in run.stdout and "VALID" in run.stdout
    assert "\r" not in run.stderr  # no progress display when stderr is not a terminal


def test_cli_validates_each_backend_once_whatever_it_is_called():
    # emu and its alias privateuse1 were validated as two backends, the table cutting the second
    # to "privateus".
    run = validate_cli("--model", "builtin:mlp", "--backends", "emu,privateuse1")
    assert run.returncode == 1
    assert "--backends 'emu,privateuse1' names backend 'emu' twice ('emu' and 'privateuse1')" in run.stderr


@pytest.mark.parametrize("fault, failing_check", [
    ("corrupt-copy", "determinism"),  # one element of the first device->host copy is corrupted
    ("drop-copy", "output"),          # the first host->device copy never happens
    ("leak", "memory"),               # freed device memory never returns
])
def test_cli_reports_the_faulty_emu_variants(fault, failing_check):
    run = validate_cli("--model", "builtin:transformer", "--backends", "cpu,emu", "--json",
                       env={"TORCHBRIDGE_EMU_FAULT": fault})
    assert run.returncode == 1, run.stdout
    report = json.loads(run.stdout)
    assert not report["valid"]
    failed = {c["check"] for c in report["checks"] if not c["passed"]}
    assert failing_check in failed, failed
    assert all(c["passed"] for c in report["checks"] if c["backend"] == "cpu")


def test_python_validator_reports_the_leaking_emu(fresh_python):
    code = """
import torch
from torchbridge import UnifiedValidator
v = UnifiedValidator(backends=["emu"])
r = v.validate_model(torch.nn.Linear(64, 64), input_shape=(8, 64))
print([c["check"] for c in r.checks if not c["passed"]], r.is_valid)
"""
    run = fresh_python(code, env={"TORCHBRIDGE_EMU_FAULT": "leak"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['memory'] False"


@pytest.mark.parametrize("args, message", [
    (["--model", "builtin:resnet"], "unknown built-in model 'resnet'"),
    (["--model", "/nonexistent.pt"], "neither builtin:NAME"),
    (["--model", "builtin:mlp", "--backends", "cpu,nope"], "unknown backend 'nope'"),
    (["--model", "builtin:mlp", "--backends", f"cpu,{UNAVAILABLE}"], f"backend '{UNAVAILABLE}' is not available"),
    (["--model", "builtin:mlp", "--input-shape", "4,x"], "bad entry 'x'"),
    (["--model", "builtin:mlp", "--input-shape", "4,7"], "does not run on the CPU with inputs of shape [4, 7]"),
    (["--model", "builtin:mlp", "--dtype", "fp4"], "precision 'fp4'"),
    (["--backends", "cpu"], "needs --model"),
])
def test_cli_bad_input_exits_1_without_a_report(args, message):
    run = validate_cli(*args)
    assert run.returncode == 1
    assert message in run.stderr
    assert "Result:" not in run.stdout and run.stdout == ""


def test_cli_validates_a_torchscript_file(tmp_path):
    path = tmp_path / "net.pt"
    torch.jit.script(SmallNet()).save(str(path))
    missing_shape = validate_cli("--model", str(path), "--backends", "cpu")
    assert missing_shape.returncode == 1 and "--input-shape" in missing_shape.stderr
    run = validate_cli("--model", str(path), "--backends", "cpu,emu", "--input-shape", "3,8", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["model_kind"] == "TorchScript"
    not_a_model = tmp_path / "junk.pt"
    not_a_model.write_bytes(b"not a zip")
    bad = validate_cli("--model", str(not_a_model), "--input-shape", "3,8")
    assert bad.returncode == 1 and "not a TorchScript module" in bad.stderr


class LogOfNegatives(torch.nn.Module):
    def forward(self, x):
        return torch.log(-x.abs() - 1)


def test_cli_table_shows_nan_where_the_report_has_no_number(tmp_path):
    # std::max kept 0 against NaN: the table read "max abs err 0.00e+00" for an all-NaN output.
    path = tmp_path / "nan.pt"
    torch.jit.script(LogOfNegatives()).save(str(path))
    run = validate_cli("--model", str(path), "--backends", "cpu", "--input-shape", "4,8")
    assert run.returncode == 1
    row = next(line.split() for line in run.stdout.splitlines() if line.split()[:2] == ["cpu", "output"])
    assert row[3:] == ["nan", "nan", "nan"], run.stdout


CPP_CLI = os.environ.get("TORCHBRIDGE_CLI_PATH")


def comparable(report):
    return [(c["backend"], c["check"], c["subject"], c["passed"], c.get("rel_l2_error")) for c in report["checks"]
            if c["check"] != "memory"]


@pytest.mark.parametrize("tool", ["python", "cpp"])
def test_isolate_validates_in_a_child_process_with_the_same_result(tool):
    """--isolate runs emu in a child process of the same tool (the Python console script restarts
    Python, the C++ binary itself) and merges its report: the same checks and the same numbers."""
    if tool == "cpp" and not CPP_CLI:
        pytest.skip("TORCHBRIDGE_CLI_PATH is not set (CTest sets it)")
    command = [CONSOLE_SCRIPT] if tool == "python" else [CPP_CLI]
    args = ["validate", "--model", "builtin:mlp", "--backends", "cpu,emu", "--json"]
    together = subprocess.run(command + args, capture_output=True, text=True, timeout=300)
    isolated = subprocess.run(command + args + ["--isolate"], capture_output=True, text=True, timeout=300)
    assert together.returncode == 0 and isolated.returncode == 0, isolated.stderr + together.stderr
    one, two = json.loads(together.stdout), json.loads(isolated.stdout)
    assert two["valid"] and two["backends"] == ["cpu", "emu"]
    assert comparable(one) == comparable(two)
    assert set(two["seconds"]["backends"]) == {"cpu", "emu"}


def test_isolated_faults_are_still_caught():
    run = validate_cli("--model", "builtin:transformer", "--backends", "cpu,emu", "--isolate", "--json",
                       env={"TORCHBRIDGE_EMU_FAULT": "leak"})
    assert run.returncode == 1, run.stdout
    failed = {(c["backend"], c["check"]) for c in json.loads(run.stdout)["checks"] if not c["passed"]}
    assert failed == {("emu", "memory")}


def test_a_child_that_fails_is_a_failed_check_not_a_lost_run():
    run = validate_cli("--model", "builtin:mlp", "--backends", "cpu,emu", "--isolate", "--json",
                       env={"TORCHBRIDGE_EMU_DEVICES": "many"})
    assert run.returncode == 1
    report = json.loads(run.stdout)
    assert not report["valid"]
    emu = [c for c in report["checks"] if c["backend"] == "emu"]
    assert len(emu) == 1 and emu[0]["check"] == "run" and not emu[0]["passed"]
    assert "exited with code 1" in emu[0]["detail"] and "TORCHBRIDGE_EMU_DEVICES" in emu[0]["detail"]
    assert all(c["passed"] for c in report["checks"] if c["backend"] == "cpu")


def test_a_backend_named_twice_is_refused_as_the_cli_refuses_it():
    with pytest.raises(ValueError, match="backends \\['cpu', 'cpu'\\] name 'cpu' twice"):
        UnifiedValidator(backends=["cpu", "cpu"])
    with pytest.raises(ValueError, match="name 'cpu' twice"):  # names ignore case, as in the CLI
        UnifiedValidator(backends="cpu,CPU")


class ReturnsADict(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        return {"logits": y, "probabilities": y.softmax(-1)}


def test_the_cli_validates_a_torchscript_file_that_returns_a_dict_as_python_does(tmp_path):
    # "the model does not run on the CPU ...: the TorchScript module returned a GenericDict", while
    # UnifiedValidator validated the same file.
    path = tmp_path / "dict.pt"
    torch.jit.save(torch.jit.script(ReturnsADict()), str(path))
    cli = subprocess.run([CONSOLE_SCRIPT, "validate", "--model", str(path), "--input-shape", "4,8", "--backends",
                          "cpu,emu", "--json"], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    report = json.loads(cli.stdout)
    python = VALIDATOR.validate_model(torch.jit.load(str(path)), input_shape=(4, 8))
    assert report["valid"] and python.is_valid
    assert sorted(c["subject"] for c in report["checks"]) == sorted(c["subject"] for c in python.checks)


def test_a_model_file_of_another_format_is_named_not_called_corrupted(tmp_path):
    # torch's "PytorchStreamReader failed locating file constants.pkl ... high likelihood that your
    # checkpoint file is corrupted" for files that are fine, only not TorchScript.
    from safetensors.torch import save_file

    model = SmallNet()
    files = {"state.pt": lambda p: torch.save(model.state_dict(), p),
             "weights.safetensors": lambda p: save_file(model.state_dict(), p),
             "program.pt2": lambda p: torch.export.save(torch.export.export(model, (torch.zeros(4, 8),)), p),
             "model.onnx": lambda p: open(p, "wb").write(b"\x08\x07")}
    expected = {"state.pt": "is a torch.save file (a state dict or a pickled model), which holds no program",
                "weights.safetensors": "is a safetensors checkpoint, which holds weights but no program",
                "program.pt2": "is a torch.export program or AOTInductor package (.pt2)",
                "model.onnx": "is an ONNX model, which torch does not run"}
    for name, write in files.items():
        write(str(tmp_path / name))
        cli = subprocess.run([CONSOLE_SCRIPT, "validate", "--model", str(tmp_path / name), "--input-shape", "4,8"],
                             capture_output=True, text=True)
        assert cli.returncode == 1 and expected[name] in cli.stderr, cli.stderr
        assert "--model reads TorchScript" in cli.stderr and "corrupted" not in cli.stderr
