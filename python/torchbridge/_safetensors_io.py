"""Safetensors files and sharded directories through the C++ core (the functions ``checkpoint``
exports). A module of its own so that ``_training_state`` can use them without importing
``checkpoint``, which imports it."""

import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

from . import _C


def names(path: str) -> "list[str]":
    """Tensor names in a file, index or directory, without reading tensor data."""
    return list(_C.checkpoint_names(str(path)))


def metadata(path: str) -> "dict[str, str]":
    return dict(_C.checkpoint_metadata(str(path)))


def load(path: str, names: "list[str] | None" = None, device="cpu") -> "dict[str, torch.Tensor]":
    """Loads `names` (all when None) onto `device`. On the CPU, tensors alias the file's private
    mapping when aligned (writes never reach the file)."""
    capsules = _C.checkpoint_load(str(path), list(names or []))
    device = torch.device(device)
    loaded = {name: from_dlpack(capsule) for name, capsule in capsules.items()}
    return loaded if device.type == "cpu" else {name: t.to(device) for name, t in loaded.items()}


def save(path: str, tensors: "dict[str, torch.Tensor]", metadata: "dict[str, str] | None" = None,
         max_shard_size: "int | str | None" = None) -> "list[str]":
    """Writes `tensors` atomically; with `max_shard_size` (bytes or e.g. "500MB"), `path` is a
    directory of Hugging Face shards plus index. Tensors sharing storage are refused."""
    limit = 0 if max_shard_size is None else (
        _C.parse_size(max_shard_size) if isinstance(max_shard_size, str) else int(max_shard_size))
    items = [(name, to_dlpack(t.detach().cpu().contiguous())) for name, t in tensors.items()]
    _check_shared_storage(tensors)
    return list(_C.checkpoint_save(str(path), items, dict(metadata or {}), limit))


def _check_shared_storage(tensors):
    # Checked on the caller's tensors: the copies made for the C++ side no longer share storage.
    owners = {}
    for name, t in tensors.items():
        if t.numel() == 0:
            continue
        key = (t.device, t.untyped_storage().data_ptr())
        if key in owners:
            raise ValueError(f"tensors '{owners[key]}' and '{name}' share storage; safetensors stores tensors "
                             "separately, so save a clone of one (e.g. for tied weights) or only one of them")
        owners[key] = name
