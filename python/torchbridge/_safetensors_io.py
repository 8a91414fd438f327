"""Safetensors files and sharded directories through the C++ core (the functions ``checkpoint``
exports). A module of its own so that ``_training_state`` can use them without importing
``checkpoint``, which imports it."""

import bisect
import errno
import os

import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

from . import _C


def check_path(path) -> str:
    """``path`` as a str; anything but a str or os.PathLike (None would name a file "None") is refused."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if not isinstance(path, str):  # a PathLike of bytes
        raise TypeError(f"path must be a str or os.PathLike of str, got {path!r}")
    _check_text(path, "path")
    return path


def _check_text(text: str, what: str) -> None:
    """The C++ core takes UTF-8; a str holding lone surrogates (os.fsdecode's stand-ins for a file
    name's undecodable bytes) reached pybind's "incompatible function arguments"."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {text!r} is not valid UTF-8 text (it holds surrogates, as os.fsdecode makes for "
                         f"bytes that are not UTF-8); checkpoints take UTF-8 file names, tensor names and "
                         f"metadata") from None


def _existing(path: str) -> str:
    """As torch.load and safetensors say it: FileNotFoundError, not the core's ValueError."""
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    return path


def names(path: str) -> "list[str]":
    """Tensor names in a file, index or directory, without reading tensor data."""
    return list(_C.checkpoint_names(_existing(check_path(path))))


def metadata(path: str) -> "dict[str, str]":
    return dict(_C.checkpoint_metadata(_existing(check_path(path))))


def load(path: str, names: "list[str] | None" = None, device="cpu") -> "dict[str, torch.Tensor]":
    """Loads `names` (all when None) onto `device`. On the CPU, tensors alias the file's private
    mapping when aligned (writes never reach the file)."""
    if isinstance(names, (str, bytes)):  # list("ab") would ask for tensors "a" and "b"
        raise TypeError(f"names must be a list of tensor names or None, got the string {names!r}")
    if names is not None:
        names = list(names)
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"names must be tensor names (str), got {name!r} ({type(name).__name__})")
            _check_text(name, "tensor name")
    capsules = _C.checkpoint_load(_existing(check_path(path)), names)
    device = torch.device(device)
    loaded = {name: from_dlpack(capsule) for name, capsule in capsules.items()}
    return loaded if device.type == "cpu" else {name: t.to(device) for name, t in loaded.items()}


def save(path: str, tensors: "dict[str, torch.Tensor]", metadata: "dict[str, str] | None" = None,
         max_shard_size: "int | str | None" = None) -> "list[str]":
    """Writes `tensors` atomically; with `max_shard_size` (bytes or e.g. "500MB"), `path` is a
    directory of Hugging Face shards plus index. Tensors whose bytes overlap (tied weights) are
    refused. Returns the paths of the files written (shards, then the index), each `path` or
    under it, so that every entry opens as it stands."""
    path = check_path(path)
    _check_arguments(tensors, metadata)
    limit = _shard_limit(max_shard_size)
    _check_shared_storage(tensors)
    # A conjugate or negative view (z.conj(), x._neg_view()) is its storage plus a bit that DLPack
    # cannot carry: resolved here, the file holds the values the tensor has.
    items = [(name, to_dlpack(t.detach().cpu().resolve_conj().resolve_neg().contiguous()))
             for name, t in tensors.items()]
    written = _C.checkpoint_save(path, items, dict(metadata or {}), limit)
    # The C++ save_sharded answers file names within the directory, as its header says.
    return [os.path.join(path, name) for name in written] if limit else list(written)


def _check_arguments(tensors, metadata) -> None:
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of str to torch.Tensor, got {type(tensors).__name__}")
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r} ({type(name).__name__})")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{name!r}] must be a torch.Tensor, got {type(t).__name__}")
        _check_text(name, "tensor name")
        # What the copy to the CPU and DLPack fail on, naming no tensor.
        if t.layout != torch.strided:
            raise ValueError(f"tensors[{name!r}] is a {t.layout} tensor; safetensors holds dense (strided) tensors: "
                             f"save t.to_dense(), or its indices and values")
        if t.is_meta:
            raise ValueError(f"tensors[{name!r}] is on the meta device, which holds no data to save")
        if t.is_quantized:
            raise ValueError(f"tensors[{name!r}] is a quantized {t.dtype} tensor, which safetensors cannot hold: "
                             f"save t.int_repr() and its quantization parameters")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be None or a dict of str to str, got {type(metadata).__name__}")
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str (safetensors metadata is strings), got {key!r}: {value!r}")
        _check_text(key, "metadata key")
        _check_text(value, f"metadata[{key!r}]")


def _shard_limit(max_shard_size) -> int:
    """Bytes per shard; 0 (one unsharded file) for None only."""
    if max_shard_size is None:
        return 0
    if isinstance(max_shard_size, str):
        try:
            return _C.parse_size(max_shard_size)
        except ValueError as error:
            raise ValueError(f"max_shard_size: {error}") from None
    if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int):
        raise TypeError(f"max_shard_size must be None (one file), a number of bytes (int) or a size such as "
                        f"'500MB', got {max_shard_size!r}")
    if max_shard_size <= 0:  # as parse_size refuses "0"
        raise ValueError(f"max_shard_size: invalid size {max_shard_size}: must be positive (None writes one file)")
    if max_shard_size >= 2**64:
        raise ValueError(f"max_shard_size: invalid size {max_shard_size}: more than 2^64 bytes")
    return max_shard_size


def _check_shared_storage(tensors):
    """Refuses two tensors whose byte spans overlap (tied weights); views of one storage whose spans
    do not (the row blocks of a fused weight) are distinct, as the safetensors package has them.
    Checked on the caller's tensors: the copies made for the C++ side no longer share storage."""
    spans = {}  # storage -> its spans' begins (sorted) and, in the same order, (end, name)
    for name, t in tensors.items():
        if t.numel() == 0:
            continue
        # torch's strides are non-negative, so the last element lies at the sum of (size - 1) * stride.
        last = t.storage_offset() + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
        begin, end = t.storage_offset() * t.element_size(), (last + 1) * t.element_size()
        begins, others = spans.setdefault((t.device, t.untyped_storage().data_ptr()), ([], []))
        # The spans of one storage never overlap, so only the neighbours of the new one can.
        at = bisect.bisect_left(begins, begin)
        for neighbour in (at - 1, at):
            if 0 <= neighbour < len(begins) and begins[neighbour] < end and begin < others[neighbour][0]:
                raise ValueError(f"tensors '{others[neighbour][1]}' and '{name}' share storage; safetensors stores "
                                 "tensors separately, so save a clone of one (e.g. for tied weights) or only one "
                                 "of them")
        begins.insert(at, begin)
        others.insert(at, (end, name))
