"""A torch.optim optimizer's state in the training-state layout of the C++ core
(src/checkpoint/training_state.cpp): per-parameter tensors as ``optimizer.<i>.<field>``, where i
counts parameters across groups in order (torch's state_dict ids count the same way), and the
type plus each group's hyper-parameters as the JSON of the ``torchbridge.optimizer`` metadata
entry. Works from ``Optimizer.state_dict()``, so any optimizer whose state is tensors and JSON
values is covered, not only SGD, Adam and AdamW."""

import json
import math

import torch

PREFIX = "optimizer."
# Per-parameter state that always has its parameter's shape, checked before anything changes.
_PARAM_SHAPED = {"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "square_avg", "acc_delta", "sum"}
# Keys in a group's JSON that are not torch hyper-parameters: the group size both writers record,
# and the Adam betas split the way the C++ reader expects them.
_LAYOUT_KEYS = {"size", "beta1", "beta2"}


def type_name(optimizer) -> str:
    """The optimizer's type as files record it: torch's name for the torch optimizer whose state an
    optimizer keeps (OffloadedAdamW keeps AdamW's), so either resumes from the other's file."""
    return getattr(optimizer, "STATE_FORMAT", None) or type(optimizer).__name__


def encode(optimizer: torch.optim.Optimizer) -> "tuple[dict[str, torch.Tensor], str]":
    """(tensors, JSON description) of ``optimizer``'s state."""
    state_dict = optimizer.state_dict()
    groups = []
    for g, group in enumerate(state_dict["param_groups"]):
        entry = {key: _json_value(value, f"param_groups[{g}][{key!r}]")
                 for key, value in group.items() if key != "params"}
        betas = group.get("betas")
        if isinstance(betas, tuple) and len(betas) == 2:
            entry["beta1"], entry["beta2"] = entry["betas"]
        entry["size"] = len(group["params"])
        groups.append(entry)
    tensors, values = {}, {}
    for index, fields in state_dict["state"].items():
        if not isinstance(index, int):
            raise NotImplementedError(f"optimizer state keyed by {index!r} (not a parameter) cannot be saved")
        for field, value in fields.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{PREFIX}{index}.{field}"] = value.detach()
            else:
                values.setdefault(str(index), {})[field] = _json_value(value, f"state[{index}][{field!r}]")
    description = {"type": type_name(optimizer), "groups": groups}
    if values:
        description["values"] = values  # non-tensor per-parameter state; the C++ reader ignores it
    return tensors, json.dumps(description)


def _json_value(value, where: str):
    """``value`` if JSON holds it exactly (None, bool, int, finite float, str, lists of these)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"optimizer {where} is {value}, which the JSON metadata cannot hold")
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"optimizer {where} is a {type(value).__name__}; training states hold per-parameter "
                    "tensors and JSON hyper-parameters (None, bool, int, float, str, lists of these)")


def _checked_description(path: str, description_json: str) -> dict:
    """The optimizer's description, its structure checked: a crafted or damaged one raised
    KeyError, AttributeError or "2 parameters but 2 were saved" (a size given as a string)."""
    def refuse(what):
        raise ValueError(f"{path}: metadata torchbridge.optimizer {what}")

    try:
        description = json.loads(description_json)
    except ValueError:
        refuse(f"is not JSON: {description_json[:80]!r}")
    if not isinstance(description, dict) or not isinstance(description.get("type"), str):
        refuse("is not an object with a \"type\" string")
    groups = description.get("groups")
    if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
        refuse("has no \"groups\" list of objects")
    for g, group in enumerate(groups):
        size = group.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            refuse(f"group {g} has size {size!r}; expected a count of parameters")
    values = description.get("values", {})
    if not isinstance(values, dict) or not all(
            isinstance(index, str) and index.isascii() and index.isdigit() and isinstance(fields, dict)
            for index, fields in values.items()):
        refuse("has \"values\" that are not an object of parameter indices to objects")
    return description


def decode(path: str, description_json: str, tensors: "dict[str, torch.Tensor]",
           optimizer: torch.optim.Optimizer, written_by_cpp: bool) -> dict:
    """A state_dict for ``optimizer.load_state_dict`` from the saved description and the
    ``optimizer.*`` tensors; raises ValueError for any mismatch, before anything is changed.
    ``written_by_cpp``: LibTorch counts Adam steps in int64, torch.optim in a float32 tensor."""
    description = _checked_description(path, description_json)
    saved_type, given_type = description["type"], type_name(optimizer)
    if saved_type != given_type:
        own_name = type(optimizer).__name__
        given = given_type if given_type == own_name else f"{own_name} ({given_type}'s state)"
        raise ValueError(f"{path}: the state holds a {saved_type} optimizer but a {given} was given")
    groups, saved_groups = optimizer.param_groups, description["groups"]
    if len(groups) != len(saved_groups):
        raise ValueError(f"{path}: {len(saved_groups)} parameter groups were saved but the optimizer has "
                         f"{len(groups)}")
    for g, (group, saved) in enumerate(zip(groups, saved_groups)):
        if saved["size"] != len(group["params"]):
            raise ValueError(f"{path}: parameter group {g} has {len(group['params'])} parameters but "
                             f"{saved['size']} were saved")
    params = [p for group in groups for p in group["params"]]
    state: "dict[int, dict]" = {}
    for name, tensor in tensors.items():
        index_text, _, field = name[len(PREFIX):].partition(".")
        if not index_text.isdigit() or not field:
            raise ValueError(f"{path}: '{name}' is not an optimizer.<index>.<field> entry")
        index = int(index_text)
        if index >= len(params):
            raise ValueError(f"{path}: '{name}' belongs to parameter {index}, but the optimizer has "
                             f"{len(params)} parameters")
        if field in _PARAM_SHAPED and tensor.shape != params[index].shape:
            raise ValueError(f"{path}: '{name}' was saved with shape {list(tensor.shape)} but the optimizer's "
                             f"parameter {index} has shape {list(params[index].shape)}")
        if written_by_cpp and field == "step" and not tensor.is_floating_point():
            # torch.optim's step counters: float64 under a float64 default dtype, else float32.
            tensor = tensor.to(torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32)
        state.setdefault(index, {})[field] = tensor
    for index, fields in description.get("values", {}).items():
        state.setdefault(int(index), {}).update(fields)
    param_groups, offset = [], 0
    for group, saved in zip(groups, saved_groups):
        # Keys the file lacks keep the optimizer's own value: C++ files carry only what LibTorch
        # has (no maximize, foreach, capturable, ...).
        restored = {key: value for key, value in group.items() if key != "params"}
        for key, value in saved.items():
            if key not in _LAYOUT_KEYS:
                restored[key] = tuple(value) if isinstance(group.get(key), tuple) else value
        if "betas" not in saved and "beta1" in saved:
            restored["betas"] = (saved["beta1"], saved["beta2"])
        restored["params"] = list(range(offset, offset + saved["size"]))
        offset += saved["size"]
        param_groups.append(restored)
    return {"state": state, "param_groups": param_groups}
