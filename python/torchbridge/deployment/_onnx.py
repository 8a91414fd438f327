"""ONNX export through torch.onnx.export, verified by running the file in onnxruntime."""

import copy
import importlib

import torch

from . import _common
from ._result import ExportResult

# Default tolerance of the onnxruntime check: ONNX Runtime's float kernels (matmul blocking, fused
# GELU/LayerNorm/attention) round differently from PyTorch's, typically by 1e-7..1e-6 in float32.
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


def export_to_onnx(model, output_path=None, sample_input=None, opset_version: "int | None" = None, *,
                   input_names: "list[str] | None" = None, output_names: "list[str] | None" = None,
                   dynamic_axes: "dict | None" = None, rtol: float = DEFAULT_RTOL,
                   atol: float = DEFAULT_ATOL) -> ExportResult:
    """Exports ``model`` with ``torch.onnx.export`` (``opset_version`` None: torch's default;
    ``input_names``, ``output_names`` and ``dynamic_axes`` as torch.onnx.export takes them), checks
    the file with ``onnx.checker``, runs it in onnxruntime (CPU) on ``sample_input`` and compares
    with PyTorch's output: every element within ``atol + rtol * |expected|``.

    Exporter: an nn.Module goes through torch's default exporter in torch 2.13, the one built on
    torch.export (``dynamo=True``; needs the ``onnxscript`` package). A ScriptModule goes through
    the TorchScript-based exporter (``dynamo=False``), the only one that accepts ScriptModules.
    The export runs on the CPU: a model on another device is exported from a CPU copy."""
    _common.check_model(model)
    scripted = _common.is_scripted(model)
    onnx, ort = _require_packages(scripted)
    path = _common.check_output_path(output_path, "model.onnx")
    inputs = _common.check_sample_input(sample_input, "trace the model and check the ONNX file in onnxruntime")
    _check_options(opset_version, input_names, output_names, dynamic_axes, rtol, atol)

    tensors = [*model.parameters(), *model.buffers(), *inputs]
    if any(t.device.type != "cpu" for t in tensors):
        model, inputs = copy.deepcopy(model).cpu(), tuple(t.cpu() for t in inputs)
    with _common.eval_mode(model):
        expected = _common.run_model(model, inputs)
        options = {"opset_version": opset_version, "input_names": input_names, "output_names": output_names,
                   "dynamic_axes": dynamic_axes}
        options = {k: v for k, v in options.items() if v is not None}
        try:
            torch.onnx.export(model, inputs, path, dynamo=not scripted, verbose=False, **options)
        except Exception as error:  # the exporter's own error says which operation or construct failed
            raise RuntimeError(f"torch.onnx.export could not export {type(model).__name__}: {error}") from error
    onnx.checker.check_model(path)

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    graph_inputs = session.get_inputs()
    if len(graph_inputs) != len(inputs):
        raise ValueError(f"the ONNX graph takes {len(graph_inputs)} inputs ({[i.name for i in graph_inputs]}) "
                         f"but sample_input has {len(inputs)}; inputs the model ignores are dropped by the exporter")
    feeds = {graph_input.name: _to_numpy(t, i) for i, (graph_input, t) in enumerate(zip(graph_inputs, inputs))}
    got = [torch.from_numpy(output) for output in session.run(None, feeds)]
    error = _common.compare(expected, got, rtol, atol, "onnxruntime")
    return ExportResult(path=path, format="onnx", max_abs_error=error, tolerance=(rtol, atol))


def _require_packages(scripted: bool):
    needed = ["onnx", "onnxruntime"] + ([] if scripted else ["onnxscript"])
    modules, missing = {}, []
    for name in needed:
        try:
            modules[name] = importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        why = " (torch's ONNX exporter for nn.Modules needs onnxscript)" if "onnxscript" in missing else ""
        raise ImportError(f"export_to_onnx needs the packages {', '.join(missing)}{why}: "
                          f"pip install {' '.join(missing)}")
    return modules["onnx"], modules["onnxruntime"]


def _check_options(opset_version, input_names, output_names, dynamic_axes, rtol, atol) -> None:
    if opset_version is not None:
        if isinstance(opset_version, bool) or not isinstance(opset_version, int):
            raise TypeError(f"opset_version must be None (torch's default) or an int, got {opset_version!r}")
        if opset_version < 7:
            raise ValueError(f"opset_version must be an ONNX opset number >= 7, got {opset_version}")
    for label, names in (("input_names", input_names), ("output_names", output_names)):
        if names is not None and (not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names)):
            raise TypeError(f"{label} must be a list of str, got {names!r}")
    if dynamic_axes is not None and not isinstance(dynamic_axes, dict):
        raise TypeError(f"dynamic_axes must be a dict (name -> axes), got {type(dynamic_axes).__name__}")
    for label, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{label} must be a number, got {value!r}")
        if not value >= 0:
            raise ValueError(f"{label} must be >= 0, got {value!r}")


def _to_numpy(tensor: torch.Tensor, index: int):
    try:
        return tensor.detach().numpy()
    except TypeError as error:  # numpy has no bfloat16 or float8
        raise TypeError(f"sample_input {index} has dtype {tensor.dtype}, which onnxruntime's Python API cannot "
                        "take (it is fed through numpy)") from error
