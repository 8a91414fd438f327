"""TorchScript export through torch.jit, verified by loading the file back."""

import torch

from . import _common
from ._result import ExportResult

_METHODS = ("trace", "script")


def export_to_torchscript(model, output_path=None, sample_input=None, method: str = "trace") -> ExportResult:
    """Compiles ``model`` with ``torch.jit.trace`` (on ``sample_input``) or ``torch.jit.script``,
    saves it with ``torch.jit.save``, loads the file back and checks that its outputs on
    ``sample_input`` equal the model's exactly (TorchScript runs the same kernels). A model that
    is already a ScriptModule is saved as it is, whatever ``method`` says. The file is written
    beside ``output_path`` and moved over it only once it passes the check, so a failure leaves no
    file and an existing one untouched."""
    _common.check_model(model)
    path = _common.check_output_path(output_path, "model.pt")
    inputs = _common.check_sample_input(sample_input, "check the exported module against the model")
    if method not in _METHODS:
        raise ValueError(f"method {method!r}: expected 'trace' or 'script'")
    with _common.eval_mode(model):
        with torch.no_grad():  # as the module is traced and run below
            expected = _common.run_model(model, inputs)
        compiled = model if _common.is_scripted(model) else _compile(model, inputs, method)
        with _common.replacing(path) as partial:
            torch.jit.save(compiled, partial)
            loaded = torch.jit.load(partial, map_location=inputs[0].device)
            got = _common.flatten(_run(loaded, inputs))
            error = _common.compare(expected, got, 0.0, 0.0, "the TorchScript file")
    return ExportResult(path=path, format="torchscript", max_abs_error=error)


def _compile(model, inputs, method: str):
    try:
        if method == "trace":
            with torch.no_grad():
                return torch.jit.trace(model, _common.fresh(inputs))
        return torch.jit.script(model)
    except Exception as error:  # torch.jit's own errors name the construct it cannot compile
        hint = "; method='trace' records the operations run on sample_input instead" if method == "script" else ""
        raise RuntimeError(f"torch.jit.{method} could not compile {type(model).__name__}: {error}{hint}") from error


def _run(module, inputs):
    with torch.no_grad():
        return module(*_common.fresh(inputs))
