"""The successors of TorchScript (deprecated in torch 2.13): torch.export programs (``.pt2`` by
``torch.export.save``) and AOTInductor packages (``.pt2`` by
``torch._inductor.aoti_compile_and_package``, which C++ runs through
``torchbridge::CompiledModel``). Each is verified by loading the written file back and running it
on the sample input; the file is written beside its target and renamed over it only then, so a
failed export leaves no file and an existing one untouched."""

import os

import torch

from . import _common, _cxx_runtime
from ._result import ExportResult, ExportVerificationError

# AOTInductor generates its own kernels (fusions, other reduction orders): float32 results differ
# from eager's by rounding, as ONNX Runtime's do. The exported program runs torch's own kernels.
AOTI_DEFAULT_RTOL = 1e-4
AOTI_DEFAULT_ATOL = 1e-5
# Device types inductor generates code for; an SDK device (PrivateUse1, e.g. emu) has no inductor
# backend, so its packages cannot be built.
_AOTI_DEVICE_TYPES = ("cpu", "cuda", "xpu")


def export_to_exported_program(model, output_path=None, sample_input=None) -> ExportResult:
    """Captures ``model`` with ``torch.export.export`` on ``sample_input`` (a ScriptModule through
    torch's TorchScript converter, ``torch._export.converter.TS2EPConverter``), saves the program
    with ``torch.export.save``, loads it back with ``torch.export.load`` and checks that it
    reproduces the model's outputs exactly (it runs the same ATen kernels). Shapes are the
    sample's: torch.export specializes them unless dynamic shapes are declared, which this does
    not do."""
    _common.check_model(model)
    path = _common.check_output_path(output_path, "model.pt2")
    inputs = _common.check_sample_input(sample_input, "capture the program and check it against the model")
    with _common.eval_mode(model):
        expected = _common.run_model(model, inputs)
        program = _capture(model, inputs)
        with _common.replacing(path) as partial:
            torch.export.save(program, partial)
            loaded = torch.export.load(partial)
            error = _compare_with_model(model, inputs, expected, _run(loaded.module(), inputs), 0.0, 0.0,
                                        "the exported program")
    return ExportResult(path=path, format="exported", max_abs_error=error)


def export_to_aoti(model, output_path=None, sample_input=None, *, rtol: float = AOTI_DEFAULT_RTOL,
                   atol: float = AOTI_DEFAULT_ATOL) -> ExportResult:
    """Captures ``model`` as in ``export_to_exported_program``, compiles it ahead of time with
    AOTInductor for the device ``sample_input`` is on (cpu, or cuda/xpu where torch has them),
    packages it, loads the package back with ``torch._inductor.aoti_load_package`` and checks its
    outputs against the model's within ``atol + rtol * |expected|``. The package holds machine
    code for that device type (and, for CUDA, the GPU's architecture) and the sample's shapes;
    C++ runs it with ``torchbridge::CompiledModel``. The package refuses other shapes only in a
    process where ``AOTI_RUNTIME_CHECK_INPUTS=1`` is set when it loads (CompiledModel and this
    function set it unless it is set): loaded elsewhere without it, another batch size runs
    unchecked and returns wrong numbers. Compiling takes seconds to minutes (a C++
    compiler runs)."""
    _common.check_model(model)
    path = _common.check_output_path(output_path, "model.pt2")
    if not path.endswith(".pt2"):
        raise ValueError(f"output_path '{path}': an AOTInductor package's name ends in .pt2 (torch requires it)")
    inputs = _common.check_sample_input(sample_input, "compile the package and check it against the model")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    device = inputs[0].device
    if device.type not in _AOTI_DEVICE_TYPES:
        raise ValueError(f"AOTInductor generates code for {', '.join(_AOTI_DEVICE_TYPES)}; the sample input is on "
                         f"{device}, which has no inductor backend (export_to_exported_program writes a portable "
                         "program instead)")
    placed = {t.device for t in (*model.parameters(), *model.buffers(), *inputs)}
    if placed != {device}:
        raise ValueError(f"the model and the sample input must be on one device for AOTInductor, found "
                         f"{sorted(map(str, placed))}")
    with _common.eval_mode(model):
        expected = _common.run_model(model, inputs)
        program = _capture(model, inputs)
        with _common.replacing(path) as partial:
            try:
                with _cxx_runtime.one_runtime_for_inductor():
                    torch._inductor.aoti_compile_and_package(program, package_path=partial)
            except Exception as error:  # inductor's own errors (compiler missing, an op it lacks)
                raise RuntimeError(f"AOTInductor could not compile {type(model).__name__}: "
                                   f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from error
            # The generated code checks its inputs' shapes, dtypes and devices only where this is set
            # when a package loads (torchbridge::CompiledModel sets it too); without it a package
            # runs another batch size unchecked, reading past its buffers.
            os.environ.setdefault("AOTI_RUNTIME_CHECK_INPUTS", "1")
            loaded = torch._inductor.aoti_load_package(partial)
            error = _compare_with_model(model, inputs, expected, _run(loaded, inputs), rtol, atol,
                                        "the AOTInductor package")
    return ExportResult(path=path, format="aoti", max_abs_error=error, tolerance=(rtol, atol))


def _compare_with_model(model, inputs, expected, got, rtol, atol, source) -> float:
    """``_common.compare``, allowing for the caller's no_grad: there some modules take a kernel
    torch.export never captures (TransformerEncoderLayer's fused fast path, 5e-7 from the captured
    program here), so a difference is measured again against the model run with grad enabled, as
    export traced it. Only then: with grad enabled the model records a graph, whose activations a
    large model exported under no_grad to save memory may not have room for."""
    try:
        return _common.compare(expected, got, rtol, atol, source)
    except ExportVerificationError:
        if torch.is_grad_enabled():
            raise
    with torch.enable_grad():
        expected = _common.run_model(model, inputs)
    return _common.compare(expected, got, rtol, atol, source)


def _capture(model, inputs) -> "torch.export.ExportedProgram":
    try:
        if _common.is_scripted(model):
            from torch._export.converter import TS2EPConverter

            converted = TS2EPConverter(model, _common.fresh(inputs)).convert()
            # The converter declares every dimension dynamic (e.g. batch s22 >= 2) though nothing
            # checks the program at any shape but the sample's; exporting its module again
            # specializes the shapes to the sample's, as for an eager model (and as documented).
            return torch.export.export(converted.module(), _common.fresh(inputs))
        return torch.export.export(model, _common.fresh(inputs))
    except Exception as error:  # torch.export names the construct it cannot capture
        how = "torch's TorchScript converter" if _common.is_scripted(model) else "torch.export.export"
        raise RuntimeError(f"{how} could not capture {type(model).__name__}: {str(error).splitlines()[0]}") from error


def _run(program_module, inputs) -> "list[torch.Tensor]":
    with torch.no_grad():
        return _common.flatten(program_module(*_common.fresh(inputs)))
