"""torch.jit's successors as export formats: torch.export programs (``export_to_exported_program``,
``torchbridge export --format exported``) and AOTInductor packages (``export_to_aoti``,
``--format aoti``), checked against the eager model in Python and, for packages, run from C++
through UnifiedManager::load_compiled (tests/cpp/compiled_model_interop.cpp). Failures leave no
file behind and an existing one untouched; a foreign .pt2 is an error, not a crash."""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch
from safetensors.torch import load_file, save_file

from torchbridge import _C, deployment
from torchbridge.deployment import ExportVerificationError, _common, _cxx_runtime
from torchbridge.validation import builtin_model

from test_compiled_model import INTEROP
from test_export_cli import BINARY, export

os.environ.setdefault("TORCHBRIDGE_EMU_GUARDED", "1")


def _build_check(name):
    """One of scripts/'s build checks, as a module: its ELF helpers judge the packages' libraries here."""
    spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).resolve().parents[2] / "scripts" /
                                                  f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CXX_RUNTIME_CHECK = _build_check("check_cxx_runtime")


class TwoHeads(torch.nn.Module):
    """Tuple outputs and a buffer, as real models have."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
        self.left, self.right = torch.nn.Linear(16, 4), torch.nn.Linear(16, 2)
        self.register_buffer("shift", torch.linspace(-1, 1, 16))

    def forward(self, x):
        h = self.body(x) + self.shift
        return self.left(h), torch.softmax(self.right(h), dim=-1)


def two_heads():
    torch.manual_seed(0)
    return TwoHeads().eval(), torch.randn(3, 8)


def run_cpp(package, inputs, tmp_path):
    save_file({f"input{i}": t.contiguous() for i, t in enumerate(inputs)}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    result = subprocess.run([INTEROP, str(package), str(tmp_path / "in.safetensors"), str(out), "O2"],
                            capture_output=True, text=True, timeout=300)
    return result, (load_file(str(out)) if result.returncode == 0 else None)


def test_exported_program_reloads_with_identical_outputs(tmp_path):
    model, x = two_heads()
    result = deployment.export_to_exported_program(model, tmp_path / "m.pt2", x)
    assert (result.format, result.max_abs_error) == ("exported", 0.0)
    program = torch.export.load(str(result))
    for got, want in zip(program.module()(x), model(x)):
        assert torch.equal(got, want)
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt2"]  # no partial file left


def test_a_module_with_a_no_grad_fast_path_exports_exactly(tmp_path):
    # TransformerEncoderLayer takes its fast path under no_grad in eval mode; the expected output
    # was computed so while torch.export captured the other path (5.96e-7 apart at tolerance 0).
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    result = deployment.export_to_exported_program(model, tmp_path / "e.pt2", torch.randn(4, 10, 32))
    assert result.max_abs_error == 0.0


class NonFinite(torch.nn.Module):
    def forward(self, x):
        return torch.log(x), torch.sqrt(x)  # -inf at 0, NaN below it


def test_nan_and_infinite_outputs_match_themselves(tmp_path):
    # NaN compared as zero difference but failed its NaN allowance; inf - inf is NaN.
    x = torch.tensor([[0.0, -1.0, 4.0]])
    assert deployment.export_to_exported_program(NonFinite(), tmp_path / "n.pt2", x).max_abs_error == 0.0
    assert deployment.export_to_torchscript(NonFinite(), tmp_path / "n.pt", x).max_abs_error == 0.0
    with pytest.raises(ExportVerificationError, match="differs from the model"):
        _common.compare([torch.tensor([float("inf")])], [torch.tensor([1e30])], 1e-4, 1e-5, "a file")
    with pytest.raises(ExportVerificationError, match="differs from the model"):
        _common.compare([torch.tensor([float("nan")])], [torch.tensor([0.0])], 1e-4, 1e-5, "a file")


def test_an_exported_program_made_under_no_grad_matches_the_model(tmp_path):
    # Inference code runs under no_grad, where TransformerEncoder takes a fused fast path that
    # torch.export never captures: compared with it, the program was refused (5e-7 apart).
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        result = deployment.export_to_exported_program(model, tmp_path / "te.pt2", x)
    assert result.max_abs_error == 0.0
    with torch.enable_grad():
        assert torch.equal(torch.export.load(str(result)).module()(x), model(x))


def test_a_script_module_is_converted(tmp_path):
    model = builtin_model("transformer")
    x = torch.randn(_C.builtin_model_input_shape("transformer"))
    result = deployment.export_to_exported_program(model, tmp_path / "t.pt2", x)
    program = torch.export.load(str(result))
    assert torch.equal(program.module()(x), model(x))
    # Specialized to the sample's shapes, as an eager model's program is: torch's converter alone
    # declares every dimension dynamic (batch >= 2) though only the sample's shape was checked.
    assert program.range_constraints == {}
    with pytest.raises(Exception, match=r"size\(\)\[0\] == 8"):
        program.module()(torch.randn(x.shape[0] + 1, *x.shape[1:]))


def test_aoti_package_matches_eager_in_python_and_cpp(tmp_path):
    model, x = two_heads()
    result = deployment.export_to_aoti(model, tmp_path / "m.pt2", x)
    assert result.format == "aoti" and result.max_abs_error <= 1e-5 and result.tolerance == (1e-4, 1e-5)
    with torch.no_grad():
        expected = model(x)
    loaded = torch._inductor.aoti_load_package(str(result))
    for got, want in zip(loaded(x), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # Another batch size is refused: export_to_aoti set AOTI_RUNTIME_CHECK_INPUTS, without which the
    # package ran batch 16 of a batch-8 package, 0.45 to 0.71 from eager, differently each run.
    assert os.environ["AOTI_RUNTIME_CHECK_INPUTS"] == "1"
    with pytest.raises(Exception, match="(?i)size|shape|dim"):
        loaded(torch.cat([x, x]))
    if not os.path.exists(INTEROP):
        pytest.skip(f"the C++ helper {INTEROP} is not built (scripts/setup.sh builds it)")
    cpp, outputs = run_cpp(result, [x], tmp_path)
    assert cpp.returncode == 0, cpp.stderr
    for i, want in enumerate(expected):
        torch.testing.assert_close(outputs[f"output{i}"], want, rtol=1e-4, atol=1e-5)


def test_cli_exports_both_formats_and_cpp_runs_the_package(tmp_path):
    shape = _C.builtin_model_input_shape("mlp")
    run = export("--model", "builtin:mlp", "--format", "exported", "--output", str(tmp_path / "mlp_ep.pt2"))
    assert run.returncode == 0, run.stderr
    assert "(exported, builtin:mlp), verified by torch.export.load: max abs error 0" in run.stdout
    model, x = builtin_model("mlp"), torch.randn(shape)
    assert torch.equal(torch.export.load(str(tmp_path / "mlp_ep.pt2")).module()(x), model(x))

    run = export("--model", "builtin:mlp", "--format", "aoti", "--output", str(tmp_path / "mlp.pt2"))
    assert run.returncode == 0, run.stderr
    assert "(aoti, builtin:mlp), verified by aoti_load_package" in run.stdout
    if not os.path.exists(INTEROP):
        pytest.skip(f"the C++ helper {INTEROP} is not built (scripts/setup.sh builds it)")
    cpp, outputs = run_cpp(tmp_path / "mlp.pt2", [x], tmp_path)
    assert cpp.returncode == 0, cpp.stderr
    with torch.no_grad():
        torch.testing.assert_close(outputs["output0"], model(x), rtol=1e-4, atol=1e-5)

    # A torch.export program is not an AOTInductor package: C++ says so instead of crashing.
    cpp, _ = run_cpp(tmp_path / "mlp_ep.pt2", [x], tmp_path)
    assert cpp.returncode == 1, (cpp.returncode, cpp.stderr)
    assert "mlp_ep.pt2' is not an AOTInductor package" in cpp.stderr, cpp.stderr
    assert "holds no compiled model" in cpp.stderr


def test_the_cpp_binary_says_these_formats_need_python(tmp_path):
    if BINARY is None:
        pytest.skip("TORCHBRIDGE_CLI_PATH (the C++ binary) is set by CTest")
    for export_format in ("exported", "aoti"):
        run = export("--model", "builtin:mlp", "--format", export_format, "--output", str(tmp_path / "m.pt2"),
                     program=BINARY)
        assert run.returncode != 0
        assert f"--format {export_format} needs torch.export, which only Python has" in run.stderr


# ---- bad input ---------------------------------------------------------------------------------------
class DataDependent(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x - 1  # a branch on values: torch.export cannot capture it


def test_failures_leave_existing_files_untouched(tmp_path):
    target = tmp_path / "m.pt2"
    target.write_bytes(b"an earlier export")
    with pytest.raises(RuntimeError, match="torch.export.export could not capture DataDependent"):
        deployment.export_to_exported_program(DataDependent(), target, torch.ones(3))
    with pytest.raises(ValueError, match="sample_input .* does not fit the model TwoHeads"):
        deployment.export_to_exported_program(two_heads()[0], target, torch.ones(3, 5))
    assert target.read_bytes() == b"an earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt2"]


def test_bad_arguments_are_named(tmp_path):
    model, x = two_heads()
    with pytest.raises(ValueError, match="output_path is required"):
        deployment.export_to_aoti(model, None, x)
    with pytest.raises(ValueError, match="is a directory"):
        deployment.export_to_exported_program(model, tmp_path, x)
    with pytest.raises(ValueError, match="sample_input is required"):
        deployment.export_to_aoti(model, tmp_path / "m.pt2")
    with pytest.raises(ValueError, match="an AOTInductor package's name ends in .pt2"):
        deployment.export_to_aoti(model, tmp_path / "m.so", x)
    with pytest.raises(ValueError, match="rtol must be a number >= 0, got -1"):
        deployment.export_to_aoti(model, tmp_path / "m.pt2", x, rtol=-1)


def test_aoti_refuses_an_sdk_device_in_a_child_process(tmp_path):
    # emu is loaded in a child: this file's other tests compile on the CPU without it.
    code = ("import torch, torchbridge\n"
            "torchbridge.devices.load('emu')\n"
            "from torchbridge import deployment\n"
            "model = torch.nn.Linear(4, 2).to('emu')\n"
            "try:\n"
            f"    deployment.export_to_aoti(model, {str(tmp_path / 'e.pt2')!r}, torch.randn(2, 4, device='emu'))\n"
            "except ValueError as error:\n"
            "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "AOTInductor generates code for cpu, cuda, xpu; the sample input is on emu:0, which has no inductor " \
           "backend" in result.stdout
    assert not (tmp_path / "e.pt2").exists()


# ---- a compiler that copies libstdc++ into shared libraries (the GPU images' /opt/gcc) -------------
@pytest.fixture
def static_runtime_compiler(tmp_path):
    """The machine's g++, made to link libstdc++ statically into shared libraries as /opt/gcc does."""
    real = shutil.which(os.environ.get("CXX", "g++"))
    if not sys.platform.startswith("linux") or real is None or "clang" in os.path.basename(real):
        pytest.skip("needs GCC on Linux (-static-libstdc++ as the GPU images' toolchain applies it)")
    wrapper = tmp_path / "static-toolchain" / "g++"  # inductor tells GCC by the name
    wrapper.parent.mkdir()
    wrapper.write_text("#!/bin/sh\n"
                       'for a in "$@"; do [ "$a" = -shared ] && exec ' + real + ' -static-libstdc++ "$@"; done\n'
                       'exec ' + real + ' "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_the_runtime_probe_is_doctors_and_says_what_it_could_not_tell(tmp_path):
    """export asks doctor's probe (cli/compiler_runtime.cpp): a compiler that cannot be started is an
    error naming it; a probe that cannot tell warns, and inductor then compiles as it would."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the probe reads ELF libraries")
    with pytest.raises(RuntimeError, match=r"inductor's C\+\+ compiler cannot be started: cannot start /nonexistent/c\+\+"):
        _cxx_runtime.links_runtime_statically("/nonexistent/c++")
    failing = tmp_path / "c++"
    failing.write_text("#!/bin/sh\necho 'probe.cpp: no such header' >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.warns(RuntimeWarning, match=r"could not tell whether .*c\+\+ links libstdc\+\+ statically .*"
                                            r"the probe library did not build .*no such header"):
        assert not _cxx_runtime.links_runtime_statically(str(failing))
    if shutil.which("g++") and shutil.which("readelf"):
        # The reference: a library g++ builds here, read by the build's own check (copied on the
        # GPU images' /opt/gcc, shared on Debian's g++).
        source = tmp_path / "one.cpp"
        source.write_text("#include <string>\nstd::string one(int n) { return std::to_string(n); }\n")
        subprocess.run(["g++", "-shared", "-fPIC", str(source), "-o", str(tmp_path / "libone.so")], check=True)
        expected = "shared" if CXX_RUNTIME_CHECK.needs_cxx_runtime(tmp_path / "libone.so") else "copied"
        assert _C._probe_compiler_runtime("g++") == (expected, "")


def test_aoti_packages_use_the_process_runtime_when_the_compiler_would_copy_it(static_runtime_compiler, tmp_path):
    """On the H200 `export --format aoti` died by SIGSEGV loading its own package: inductor's compiler
    had copied libstdc++ into the model library beside torch's (deployment/_cxx_runtime.py)."""
    # The control, inductor alone in a child (it may crash): the package builds, and then does not
    # load beside torch (std::bad_cast on the 2-core VM, SIGSEGV on the H200).
    control = ("import sys, torch\n"
               "torch._inductor.config.cpp.cxx = (sys.argv[1],)\n"
               "model, x = torch.nn.Linear(8, 4).eval(), torch.randn(2, 8)\n"
               "torch._inductor.aoti_compile_and_package(torch.export.export(model, (x,)), package_path=sys.argv[2])\n"
               "print('built', flush=True)\n"
               "torch._inductor.aoti_load_package(sys.argv[2])(x)\n")
    result = subprocess.run([sys.executable, "-c", control, static_runtime_compiler, str(tmp_path / "control.pt2")],
                            capture_output=True, text=True, timeout=300)
    assert "built" in result.stdout, f"the control's package did not build:\n{result.stderr[-2000:]}"
    assert result.returncode != 0, "the control loaded: the emulated toolchain no longer shows the defect"
    assert result.returncode < 0 or "bad_cast" in result.stderr or "API call failed" in result.stderr, \
        result.stderr[-2000:]
    assert _cxx_runtime.links_runtime_statically(static_runtime_compiler)

    model, x = two_heads()
    with torch._inductor.config.patch({"cpp.cxx": (static_runtime_compiler,)}):
        result = deployment.export_to_aoti(model, tmp_path / "m.pt2", x)  # loads the package and runs it
    assert result.max_abs_error <= 1e-5
    with zipfile.ZipFile(str(result)) as package:
        libraries = [name for name in package.namelist() if name.endswith(".so")]
        assert libraries, package.namelist()
        for name in libraries:
            package.extract(name, tmp_path / "unpacked")
    for name in libraries:
        library = tmp_path / "unpacked" / name
        assert CXX_RUNTIME_CHECK.needs_cxx_runtime(library), f"{name} does not need the shared C++ runtime"
        assert CXX_RUNTIME_CHECK.RUNTIME_SYMBOL not in CXX_RUNTIME_CHECK.defined_symbols(library), \
            f"{name} carries its own libstdc++"


# ---- the validator runs a package (validate --compiled) ---------------------------------------------
def validate(*args):
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "torchbridge"), "validate", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory):
    path = tmp_path_factory.mktemp("aoti") / "mlp.pt2"
    run = export("--model", "builtin:mlp", "--format", "aoti", "--output", str(path))
    assert run.returncode == 0, run.stderr
    return path


def test_validate_checks_a_package_against_the_float64_reference(mlp_package):
    run = validate("--model", "builtin:mlp", "--backends", "cpu", "--compiled", str(mlp_package), "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    compiled = [c for c in report["checks"] if c["backend"] == "compiled"]
    assert [(c["check"], c["subject"], c["passed"]) for c in compiled] == [("run", "model", True),
                                                                           ("output", "output 0", True)]
    assert compiled[1]["device"] == "cpu" and 0 <= compiled[1]["max_abs_error"] < 1e-5
    assert "compiled" in report["backends"]


def test_validate_reports_a_package_of_another_model_as_a_failed_check(mlp_package):
    run = validate("--model", "builtin:cnn", "--backends", "cpu", "--compiled", str(mlp_package))
    assert run.returncode == 1, run.stderr
    assert "compiled  run          0/1" in run.stdout
    assert "refused its inputs" in run.stdout


def test_validate_refuses_a_foreign_pt2_and_other_dtypes(mlp_package, tmp_path):
    program = deployment.export_to_exported_program(builtin_model("mlp"), tmp_path / "ep.pt2",
                                                    torch.randn(_C.builtin_model_input_shape("mlp")))
    run = validate("--model", "builtin:mlp", "--backends", "cpu", "--compiled", str(program))
    assert run.returncode != 0 and "ep.pt2' is not an AOTInductor package" in run.stderr, run.stderr
    assert run.stdout == ""  # refused before any validation
    run = validate("--model", "builtin:mlp", "--backends", "cpu", "--dtype", "bf16", "--compiled", str(mlp_package))
    assert run.returncode != 0 and "--compiled checks the package in fp32" in run.stderr, run.stderr


@pytest.mark.parametrize("export_with", ["exported_program", "torchscript", "optimize_validation"])
def test_every_submodule_gets_its_own_mode_back(tmp_path, export_with):
    """Exporting and validating run in eval mode, then put the model back. model.train(True) put
    back every submodule, so a BatchNorm the program keeps frozen (eval in a training model) came
    back training and updated its statistics (found 2026-11-29)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.1))
    model.train()
    model[1].eval()
    sample = torch.randn(3, 4)
    if export_with == "exported_program":
        deployment.export_to_exported_program(model, output_path=str(tmp_path / "m.pt2"), sample_input=sample)
    elif export_with == "torchscript":
        deployment.export_to_torchscript(model, output_path=str(tmp_path / "m.pt"), sample_input=sample,
                                         method="trace")
    else:
        from torchbridge import TorchBridgeConfig, UnifiedManager
        config = TorchBridgeConfig.for_training()
        config.validation, config.compile = True, False
        UnifiedManager(config).optimize(model, example_inputs=sample)
    assert [m.training for m in model] == [True, False, True]


class MergingLinear(torch.nn.Linear):
    """As LoRA layers do: eval() merges an update into the weight, train(True) takes it out again."""

    def __init__(self):
        super().__init__(4, 4)
        self.merged = False

    def train(self, mode=True):
        super().train(mode)
        if mode == self.merged:  # merged in eval, unmerged in training
            with torch.no_grad():
                self.weight.mul_(2.0 if not mode else 0.5)  # exact both ways
            self.merged = not mode
        return self


def test_a_module_overriding_train_is_put_back_through_it(tmp_path):
    """eval_mode restores modes with train(), so a module whose train() undoes what its eval did
    (merged weights) is left as it was, not flagged training with its eval state."""
    model = torch.nn.Sequential(MergingLinear(), torch.nn.ReLU())
    model.train()
    weight = model[0].weight.detach().clone()
    deployment.export_to_exported_program(model, output_path=str(tmp_path / "m.pt2"), sample_input=torch.randn(2, 4))
    assert model[0].training and not model[0].merged
    assert torch.equal(model[0].weight.detach(), weight)
