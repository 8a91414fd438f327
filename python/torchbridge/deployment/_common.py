"""Argument checks and the run-and-compare steps every exporter shares."""

import contextlib
import os
import shutil
import tempfile

import torch

from .._outputs import eval_mode, flatten  # noqa: F401  (also used as _common.eval_mode, _common.flatten)
from ._result import ExportVerificationError


def check_model(model) -> None:
    if not isinstance(model, torch.nn.Module):  # torch.jit.ScriptModule is an nn.Module too
        raise TypeError(f"model must be a torch.nn.Module or a torch.jit.ScriptModule, got {type(model).__name__}")


def is_scripted(model) -> bool:
    return isinstance(model, torch.jit.ScriptModule)


def check_output_path(output_path, example: str, sidecar: str = "") -> str:
    """The path as a string, once its directory exists and is writable and its name (with the
    ``sidecar`` suffix a writer puts beside it, ONNX's ``.data``) fits the file system, so a long
    export does not fail only at the end."""
    if output_path is None:
        raise ValueError(f"output_path is required: the file to write, e.g. {example!r}")
    if not isinstance(output_path, (str, os.PathLike)):
        raise TypeError(f"output_path must be a str or os.PathLike, got {type(output_path).__name__}")
    path = os.fspath(output_path)
    if not path or path.endswith((os.sep, "/")):
        raise ValueError(f"output_path {path!r} names no file; expected a file path such as {example!r}")
    if os.path.isdir(path):
        raise ValueError(f"output_path '{path}' is a directory; expected a file path such as {example!r}")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"output_path '{path}': directory '{directory}' does not exist")
    if not os.access(directory, os.W_OK):
        raise ValueError(f"output_path '{path}': directory '{directory}' is not writable")
    name_bytes = len(os.fsencode(os.path.basename(path) + sidecar))
    try:
        longest = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):  # a file system that does not say: the common limit
        longest = 255
    if name_bytes > longest:
        raise ValueError(f"output_path '{path}': the file name{f' with {sidecar!r}' if sidecar else ''} is "
                         f"{name_bytes} bytes, longer than the {longest} this file system allows")
    return path


def check_sample_input(sample_input, purpose: str) -> "tuple[torch.Tensor, ...]":
    """``sample_input`` as a tuple of positional tensors."""
    if sample_input is None:
        raise ValueError(f"sample_input is required to {purpose}: a tensor or a tuple of tensors the model accepts")
    if isinstance(sample_input, torch.Tensor):
        return fresh((sample_input,))
    if isinstance(sample_input, (tuple, list)) and sample_input and all(
            isinstance(t, torch.Tensor) for t in sample_input):
        return fresh(sample_input)
    kinds = [type(v).__name__ for v in sample_input] if isinstance(sample_input, (tuple, list)) else None
    raise TypeError(f"sample_input must be a tensor or a non-empty tuple of tensors, got "
                    f"{type(sample_input).__name__}" + (f" of {kinds}" if kinds is not None else ""))


def fresh(inputs) -> "tuple[torch.Tensor, ...]":
    """A copy of the sample for one run. A model that changes its input in place (x.sub_(0.5),
    LeakyReLU(inplace=True)) changed the caller's tensor, and the next run (the trace, the exported
    file) started from other values, so a correct export was reported to differ from its model."""
    return tuple(t.clone() for t in inputs)


def describe(inputs: "tuple[torch.Tensor, ...]") -> str:
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in inputs)


def run_model(model: torch.nn.Module, inputs: "tuple[torch.Tensor, ...]",
              what: str = "sample_input") -> "list[torch.Tensor]":
    """The model's outputs on ``inputs``, flattened and detached; a failure means the input does
    not fit (``what`` names the input in the message). It runs in the caller's grad mode: under
    no_grad some modules take another kernel (TransformerEncoderLayer's fast path in eval mode)
    whose last bits differ from what an exporter captured. torch.export never captures that path,
    so its exporters run the model again under enable_grad where a no_grad comparison differs
    (_exported._compare_with_model); the TorchScript exporter traces and runs under no_grad.
    Outputs that are all empty are refused: nothing could be compared, and the file would be
    reported verified."""
    try:
        output = model(*fresh(inputs))
    except Exception as error:  # any failure of the model's own forward on this input
        raise ValueError(f"{what} ({describe(inputs)}) does not fit the model "
                         f"{type(model).__name__}: {error}") from error
    outputs = [tensor.detach() for tensor in flatten(output)]
    if all(tensor.numel() == 0 for tensor in outputs):
        raise ValueError(f"{what} ({describe(inputs)}) gives the model {type(model).__name__} only empty outputs, so "
                         "the exported file could not be checked against it; give a sample with at least one row")
    return outputs


def compare(expected: "list[torch.Tensor]", got: "list[torch.Tensor]", rtol: float, atol: float,
            source: str) -> float:
    """The largest absolute difference between ``got`` (from the exported file, run by ``source``)
    and ``expected`` (the model); raises ExportVerificationError past |got - expected| <=
    atol + rtol * |expected| (exact equality when both are 0)."""
    if len(got) != len(expected):
        raise ExportVerificationError(f"{source} returns {len(got)} outputs but the model returns {len(expected)}")
    largest = 0.0
    for i, (want, have) in enumerate(zip(expected, got)):
        want, have = want.detach().cpu(), have.detach().cpu()
        if have.shape != want.shape or have.dtype != want.dtype:
            raise ExportVerificationError(
                f"output {i}: {source} gives {tuple(have.shape)} {have.dtype}, the model {tuple(want.shape)} {want.dtype}")
        if want.numel() == 0:
            continue
        have, want = have.double(), want.double()
        # Equal values match whatever the tolerance, infinities and NaNs included (as assert_close
        # with equal_nan): inf - inf is NaN, and atol + rtol * inf would let any value match inf.
        same = (have == want) | (torch.isnan(have) & torch.isnan(want))
        difference = torch.where(same, torch.zeros_like(have), (have - want).abs())
        error = difference.max().item()
        allowed = atol + rtol * want.abs()
        if not bool((same | (torch.isfinite(want) & (difference <= allowed))).all()):
            raise ExportVerificationError(
                f"output {i}: {source} differs from the model by up to {error:.3g} "
                f"(allowed: atol {atol:g} + rtol {rtol:g} * |expected|"
                + ("; the rtol= and atol= arguments set it)" if rtol or atol else ")"))
        largest = max(largest, error)
    return largest


@contextlib.contextmanager
def replacing(path: str, sidecars: "tuple[str, ...]" = ()):
    """A path with ``path``'s file name in a temporary directory beside it (a .pt2 archive names its
    root folder after the file), moved over ``path`` when the body succeeds, together with the
    files the writer put beside it named ``path`` + a suffix in ``sidecars`` (ONNX's external
    ``.data``); a sidecar this write did not make is removed, as an earlier export's would be
    stale beside the new file. The directory is removed either way, so a failure leaves ``path``
    untouched."""
    directory, name = os.path.split(os.path.abspath(path))
    try:
        # A short name of its own: a file name near the 255-byte limit must still be writable (the
        # file inside keeps its name whole).
        staging = tempfile.mkdtemp(prefix=".torchbridge-export.", suffix=".partial", dir=directory)
    except OSError as error:  # named by the file asked for, not by the temporary directory's name
        raise type(error)(error.errno, error.strerror, path) from error
    try:
        partial = os.path.join(staging, name)
        yield partial
        written = [suffix for suffix in sidecars if os.path.exists(partial + suffix)]
        for suffix in written:  # before the file that refers to them
            os.replace(partial + suffix, os.path.join(directory, name + suffix))
        os.replace(partial, path)
        for suffix in set(sidecars) - set(written):  # after it: the new file does not refer to them
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name + suffix))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
