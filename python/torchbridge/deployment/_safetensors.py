"""Weights-only export to safetensors through TorchBridge's C++ writer (checkpoint.save)."""

import json

import torch

from .. import checkpoint
from . import _common
from ._result import ExportResult, ExportVerificationError

TIED_KEY = "torchbridge.tied_weights"


def export_to_safetensors(model, output_path=None, metadata: "dict[str, str] | None" = None) -> ExportResult:
    """Writes ``model.state_dict()`` (parameters and persistent buffers) atomically, reads the file
    back and checks every tensor bit for bit.

    Tied weights (names that are the very same tensor, e.g. an embedding shared with the output
    layer) are stored once, under the first name in state_dict order; the metadata entry
    ``torchbridge.tied_weights`` maps each alias to that name (JSON), as does the result's
    ``tied_weights``. Loading into the same architecture with ``load_state_dict(..., strict=False)``
    restores them, since the model re-ties itself. Tensors that overlap without being the same
    tensor are refused by the writer. ``metadata`` (str -> str) goes into ``__metadata__``, with
    ``format: pt`` added unless given (what Hugging Face loaders expect of PyTorch weights)."""
    _common.check_model(model)
    path = _common.check_output_path(output_path, "model.safetensors")
    header = _check_metadata(metadata)
    tensors, tied, first_name = {}, {}, {}
    for name, tensor in model.state_dict().items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state_dict entry '{name}' is a {type(tensor).__name__}; safetensors holds tensors only")
        # A conjugate or negative view of a tensor has its storage and layout but other values.
        identity = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.dtype,
                    tuple(tensor.shape), tensor.stride(), tensor.is_conj(), tensor.is_neg())
        if tensor.numel() > 0 and identity in first_name:
            tied[name] = first_name[identity]
            continue
        first_name[identity] = name
        tensors[name] = tensor.detach()
    if tied:
        header[TIED_KEY] = json.dumps(tied)
    checkpoint.save(path, tensors, metadata=header)

    reloaded = checkpoint.load(path)
    if reloaded.keys() != tensors.keys():
        raise ExportVerificationError(f"{path}: holds {sorted(reloaded)} but {sorted(tensors)} were written")
    for name, tensor in tensors.items():
        if not _same_bits(reloaded[name], tensor):
            raise ExportVerificationError(f"{path}: '{name}' does not read back bit-identically")
    return ExportResult(path=path, format="safetensors", max_abs_error=0.0, tied_weights=tied)


def _check_metadata(metadata) -> "dict[str, str]":
    if metadata is None:
        return {"format": "pt"}
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of str to str, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str (safetensors metadata is strings), got {key!r}: {value!r}")
    if TIED_KEY in metadata:
        raise ValueError(f"metadata key '{TIED_KEY}' is reserved: the export records tied weights there")
    return {"format": "pt", **metadata}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    # Compared by value: a conjugate or negative view's bytes are those of the tensor it views.
    as_bytes = [t.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
                for t in (a, b)]
    return torch.equal(*as_bytes)
