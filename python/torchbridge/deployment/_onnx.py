"""ONNX export through torch.onnx.export, verified by running the file in onnxruntime."""

import copy
import importlib
import inspect

import torch

from . import _common
from ._result import ExportResult, ExportVerificationError

# Default tolerance of the onnxruntime check: ONNX Runtime's float kernels (matmul blocking, fused
# GELU/LayerNorm/attention) round differently from PyTorch's, typically by 1e-7..1e-6 in float32.
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5
# float16 carries 11 significant bits: one rounding step near 0.5 is 2.4e-4, and the two runtimes'
# kernels differ by a few (a GELU MLP: 2.4e-4 here).
FLOAT16_RTOL = 4e-3
FLOAT16_ATOL = 1e-3


def export_to_onnx(model, output_path=None, sample_input=None, opset_version: "int | None" = None, *,
                   input_names: "list[str] | None" = None, output_names: "list[str] | None" = None,
                   dynamic_axes: "dict | None" = None, dynamic_batch: "bool | None" = None,
                   rtol: "float | None" = None, atol: "float | None" = None) -> ExportResult:
    """Exports ``model`` with ``torch.onnx.export`` (``opset_version`` None: torch's default;
    ``input_names``, ``output_names`` and ``dynamic_axes`` as torch.onnx.export takes them), checks
    the file with ``onnx.checker``, runs it in onnxruntime (CPU) and compares with PyTorch's
    output: every element within ``atol + rtol * |expected|`` (by default rtol 1e-4 and atol 1e-5,
    or 4e-3 and 1e-3 when an output is float16).

    Batch dimension: dynamic by default. Dimension 0 of every input whose first dimension has the
    size of the first input's is one symbolic ``batch`` dimension of the graph, and the file is
    checked in onnxruntime at two batch sizes: the sample's, and the sample with its first row
    appended (a sample of batch size 1 is traced at batch size 2, since torch.export fixes
    dimensions of size 1). ``dynamic_batch=False`` exports the sample's shapes exactly; explicit
    ``dynamic_axes`` take the place of ``dynamic_batch`` (giving both is an error) and are checked
    at the sample's shapes. Their keys must name inputs (``input_names``, else the forward method's
    argument names) or outputs (``output_names``): a key naming neither is refused, where torch
    would ignore it or give its axes to another input.

    Exporter: an nn.Module goes through torch's default exporter in torch 2.13, the one built on
    torch.export (``dynamo=True``; needs the ``onnxscript`` package). A ScriptModule goes through
    the TorchScript-based exporter (``dynamo=False``), the only one that accepts ScriptModules.
    The export runs on the CPU: a model on another device is exported from a CPU copy."""
    _common.check_model(model)
    scripted = _common.is_scripted(model)
    onnx, ort = _require_packages(scripted)
    path = _common.check_output_path(output_path, "model.onnx", sidecar=".data")
    inputs = _common.check_sample_input(sample_input, "trace the model and check the ONNX file in onnxruntime")
    _check_options(opset_version, input_names, output_names, dynamic_axes, rtol, atol)
    dynamic_batch = _check_dynamic_batch(dynamic_batch, dynamic_axes, inputs)
    dynamic_axes_by_input = _dynamic_axes_by_input(model, scripted, inputs, input_names, output_names, dynamic_axes)

    tensors = [*model.parameters(), *model.buffers(), *inputs]
    if any(t.device.type != "cpu" for t in tensors):
        model, inputs = copy.deepcopy(model).cpu(), tuple(t.cpu() for t in inputs)
    batched = _batched_inputs(inputs) if dynamic_batch else []
    checks = [inputs] + ([_grow_batch(inputs, batched)] if dynamic_batch else [])
    with _common.eval_mode(model):
        expected = [_common.run_model(model, checks[0])]
        if dynamic_batch:
            expected.append(_common.run_model(
                model, checks[1], "sample_input grown by one row (every input whose first dimension is the first "
                "input's taken as batched; export with dynamic_batch=False, or name the axes with dynamic_axes)"))
        rtol, atol = _default_tolerance(expected[0], rtol, atol)
        options = {"opset_version": opset_version, "input_names": input_names, "output_names": output_names}
        if dynamic_axes is not None and scripted:
            options["dynamic_axes"] = dynamic_axes
        elif dynamic_axes is not None:
            # Given by position: torch's own conversion of dynamic_axes pairs the keys with the
            # inputs in the dict's order, so {"b": ...} for inputs ("a", "b") made `a` dynamic.
            options["dynamic_shapes"] = dynamic_axes_by_input
        traced = inputs
        if dynamic_batch:
            # torch.export specializes a dimension of size 1, so a batch of one is traced at two.
            traced = checks[1] if inputs[0].shape[0] == 1 else inputs
            options.update(_batch_options(model, scripted, len(inputs), batched, input_names, output_names, expected))
        options = {k: v for k, v in options.items() if v is not None}
        # Written beside `path` (with the external weights file the exporter puts next to it) and
        # moved over it only once verified: a failure leaves an earlier export as it was.
        with _common.replacing(path, sidecars=(".data",)) as partial:
            try:
                torch.onnx.export(model, _common.fresh(traced), partial, dynamo=not scripted, verbose=False,
                                  **options)
            except Exception as error:  # the exporter's own error says which operation or construct failed
                hint = " (dynamic_batch=False exports the sample's shapes exactly)" if dynamic_batch else ""
                raise RuntimeError(f"torch.onnx.export could not export {type(model).__name__}{hint}: "
                                   f"{error}") from error
            onnx.checker.check_model(partial)
            _check_opset(onnx, partial, opset_version)
            error, sizes = _verify(ort, partial, inputs, checks, expected, batched, dynamic_batch, rtol, atol)
            symbolic = dynamic_batch or _first_dimension_is_symbolic(onnx, partial)
    return ExportResult(path=path, format="onnx", max_abs_error=error, tolerance=(rtol, atol),
                        dynamic_batch=symbolic, verified_batch_sizes=tuple(sizes))


def _default_tolerance(expected, rtol, atol) -> "tuple[float, float]":
    """The tolerance asked for, or the default for the outputs' precision."""
    half = any(t.dtype == torch.float16 for t in expected)
    return (rtol if rtol is not None else FLOAT16_RTOL if half else DEFAULT_RTOL,
            atol if atol is not None else FLOAT16_ATOL if half else DEFAULT_ATOL)


def _first_dimension_is_symbolic(onnx, path) -> bool:
    """Whether the graph's first input has a named (symbolic) first dimension, as ``dynamic_axes``
    may make it."""
    graph_inputs = onnx.load(path, load_external_data=False).graph.input
    dims = graph_inputs[0].type.tensor_type.shape.dim if graph_inputs else []
    return bool(dims) and bool(dims[0].dim_param)


def _check_opset(onnx, path, opset_version) -> None:
    """torch's exporter for nn.Modules writes opset 18 or later: asked for an older one, it tries
    to convert the graph and, when that fails, keeps the newer opset without an error. A file
    whose opset is not the one asked for would not load where that opset was the reason."""
    if opset_version is None:
        return
    written = {entry.domain: entry.version
               for entry in onnx.load(path, load_external_data=False).opset_import}.get("", None)
    if written != opset_version:
        raise ExportVerificationError(
            f"opset_version={opset_version} was asked for, but torch's exporter wrote opset {written} (it could not "
            "convert the graph down); ask for the opset it writes, or leave opset_version at None")


def _verify(ort, path, inputs, checks, expected, batched, dynamic_batch, rtol, atol) -> "tuple[float, list[int]]":
    """Runs the file at ``path`` in onnxruntime on every check input and compares with the model's
    outputs: the largest absolute error, and the batch sizes checked."""
    try:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as failure:  # e.g. a CPU kernel missing for the dtype (GELU in float64)
        raise ExportVerificationError(
            f"onnxruntime cannot load the exported graph, so it could not be checked (nothing was written): "
            f"{failure}") from failure
    graph_inputs = session.get_inputs()
    if len(graph_inputs) != len(inputs):
        raise ValueError(f"the ONNX graph takes {len(graph_inputs)} inputs ({[i.name for i in graph_inputs]}) "
                         f"but sample_input has {len(inputs)}; inputs the model ignores are dropped by the exporter")
    error, sizes = 0.0, []
    for check, want in zip(checks, expected):
        feeds = {graph_input.name: _to_numpy(t, i) for i, (graph_input, t) in enumerate(zip(graph_inputs, check))}
        batch = check[batched[0]].shape[0] if batched else None
        try:
            got = [torch.from_numpy(output) for output in session.run(None, feeds)]
        except Exception as failure:  # onnxruntime refuses the shapes: the batch did not stay dynamic
            if not dynamic_batch:
                raise
            raise ExportVerificationError(
                f"the exported graph does not run at batch size {batch} (onnxruntime: {failure}); the model's batch "
                "dimension could not be made dynamic: export with dynamic_batch=False, or name the dynamic "
                "axes with dynamic_axes") from failure
        where = "onnxruntime" if batch is None else f"onnxruntime at batch size {batch}"
        error = max(error, _common.compare(want, got, rtol, atol, where))
        if batch is not None:
            sizes.append(batch)
    return error, sizes


def _check_dynamic_batch(dynamic_batch, dynamic_axes, inputs) -> bool:
    """Whether the batch dimension is exported dynamic: by default when the first input has one."""
    if dynamic_batch is not None and not isinstance(dynamic_batch, bool):
        raise TypeError(f"dynamic_batch must be True, False or None (default: dynamic unless dynamic_axes is "
                        f"given), got {dynamic_batch!r}")
    if dynamic_axes is not None:
        if dynamic_batch is not None:
            raise ValueError("give dynamic_axes or dynamic_batch, not both: dynamic_axes names every dynamic axis "
                             "itself and takes the place of dynamic_batch")
        return False
    if inputs[0].dim() == 0:
        if dynamic_batch:
            raise ValueError("dynamic_batch=True needs a batch dimension, but the first sample_input is a 0-dim "
                             "tensor; export with dynamic_batch=False")
        return False  # nothing to make dynamic; the result says dynamic_batch=False
    return dynamic_batch is not False


def _input_names(model, scripted, count, input_names) -> "list[str]":
    """The graph's input names: those given, then the forward method's argument names."""
    if scripted:
        arguments = [a.name for a in model.forward.schema.arguments[1:]]
    else:
        parameters = inspect.signature(model.forward).parameters.values()
        arguments = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given = list(input_names or [])
    return given + [arguments[i] if i < len(arguments) else f"input_{i}" for i in range(len(given), count)]


def _dynamic_axes_by_input(model, scripted, inputs, input_names, output_names, dynamic_axes) -> "tuple | None":
    """Checks ``dynamic_axes`` against the inputs and outputs it can name and returns it as one
    entry per input, in the inputs' order (None: no dynamic axis), as ``dynamic_shapes`` takes it."""
    if dynamic_axes is None:
        return None
    names_in = _input_names(model, scripted, len(inputs), input_names)
    names_out = list(output_names or [])
    for key, axes in dynamic_axes.items():
        if key not in names_in and key not in names_out:
            outputs = (f"outputs {names_out}" if names_out else
                       "outputs (none named: name them with output_names to make an output's axes dynamic)")
            raise ValueError(f"dynamic_axes names {key!r}, which is neither one of the inputs {names_in} nor one of "
                             f"the {outputs}")
        listed = list(axes) if isinstance(axes, (dict, list, tuple)) else None
        if listed is None or not all(isinstance(a, int) and not isinstance(a, bool) for a in listed):
            raise TypeError(f"dynamic_axes[{key!r}] must be a list of axis numbers or a dict axis number -> name, "
                            f"got {axes!r}")
        if key in names_in:
            rank = inputs[names_in.index(key)].dim()
            bad = [a for a in listed if not 0 <= a < rank]
            if bad:
                raise ValueError(f"dynamic_axes[{key!r}] names axis {bad[0]}, but input {key!r} has {rank} "
                                 f"dimension(s) (axes 0..{rank - 1})")
    by_name = {key: (dict(axes) if isinstance(axes, dict) else dict.fromkeys(axes, torch.export.Dim.DYNAMIC))
               for key, axes in dynamic_axes.items()}
    return tuple(by_name.get(name) for name in names_in)


def _batched_inputs(inputs) -> "list[int]":
    """Positions of the inputs that carry the batch: dimension 0 the size of the first input's."""
    size = inputs[0].shape[0]
    return [i for i, t in enumerate(inputs) if t.dim() >= 1 and t.shape[0] == size]


def _grow_batch(inputs, batched) -> tuple:
    """The sample with its first row appended to every batched input: batch size + 1."""
    return tuple(torch.cat([t, t[:1]]) if i in batched else t for i, t in enumerate(inputs))


def _batch_options(model, scripted, input_count, batched, input_names, output_names, expected) -> dict:
    """The exporter options that make dimension 0 of the batched inputs, and of the outputs that
    follow the batch (their first dimension grew with it), one symbolic ``batch`` dimension."""
    if not scripted:  # torch.export: one Dim shared by every batched input; outputs follow by inference
        batch = torch.export.Dim("batch")
        return {"dynamic_shapes": tuple({0: batch} if i in batched else None for i in range(input_count))}
    # The TorchScript-based exporter names axes by input and output names (defaults: the forward
    # method's argument names, output_<i>).
    names_in = _input_names(model, scripted, input_count, input_names)
    given_out = list(output_names or [])
    names_out = given_out + [f"output_{i}" for i in range(len(given_out), len(expected[0]))]
    follows = [i for i, (a, b) in enumerate(zip(*expected)) if a.dim() >= 1 and b.dim() >= 1 and a.shape[0] != b.shape[0]]
    axes = {names_in[i]: {0: "batch"} for i in batched}
    axes.update({names_out[i]: {0: "batch"} for i in follows})
    return {"input_names": names_in, "output_names": names_out, "dynamic_axes": axes}


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
        if value is None:  # the default for the outputs' precision
            continue
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
