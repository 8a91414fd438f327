"""The parts of a training state beside the model and the optimizer: an LR scheduler and a
GradScaler, each kept as JSON in the safetensors metadata (``torchbridge.lr_scheduler``,
``torchbridge.grad_scaler``), the entries the C++ ``TrainingProgress`` reads and writes back.

A scheduler's ``state_dict()`` is numbers, strings, lists, tuples and dicts, but may hold what
strict JSON cannot: infinities (ReduceLROnPlateau's ``best``), tuples, dicts whose keys are not
strings, and Counters (MultiStepLR's ``milestones``: epoch -> count, whose missing keys must read
0). Those are tagged (``{"__float__": "inf"}``, ``{"__tuple__": [...]}``, ``{"__items__": [[key,
value], ...]}``, ``{"__counter__": [[key, count], ...]}``) so the state comes back exactly as it was
saved, and the metadata stays JSON that any reader parses."""

import collections
import json
import math

import torch

from . import amp as _amp

SCHEDULER_KEY = "torchbridge.lr_scheduler"
SCALER_KEY = "torchbridge.grad_scaler"
_FLOAT_TAG, _TUPLE_TAG, _ITEMS_TAG, _COUNTER_TAG = "__float__", "__tuple__", "__items__", "__counter__"
_TAGS = (_FLOAT_TAG, _TUPLE_TAG, _ITEMS_TAG, _COUNTER_TAG)
_SCALER_FIELDS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


# ---- LR scheduler ---------------------------------------------------------------------------------
def check_scheduler(scheduler, optimizer) -> None:
    if scheduler is None:
        return
    if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        raise TypeError(f"scheduler must be a torch.optim.lr_scheduler.LRScheduler or None, "
                        f"got {type(scheduler).__name__}")
    if optimizer is None or scheduler.optimizer is not optimizer:
        raise ValueError("the scheduler schedules a different optimizer than the one given; save and load it "
                         "with the optimizer it steps (its learning rates live in that optimizer's state)")


def encode_scheduler(scheduler) -> str:
    return json.dumps(_to_json(scheduler.state_dict(), f"{type(scheduler).__name__}.state_dict()"), allow_nan=False)


def decode_scheduler(path: str, text: str) -> dict:
    try:
        state = _from_json(json.loads(text))
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: metadata '{SCHEDULER_KEY}' is not a scheduler state ({error})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: metadata '{SCHEDULER_KEY}' is not a scheduler state (a {type(state).__name__})")
    return state


def _to_json(value, where: str):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {_FLOAT_TAG: repr(value)}
    if isinstance(value, list):
        return [_to_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {_TUPLE_TAG: [_to_json(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)) in _TAGS:
            raise ValueError(f"{where} is a dict whose only key is {next(iter(value))!r}, which the training "
                             "state uses as a tag and could not tell apart on loading")
        items = [[_to_json(key, f"{where} key {key!r}"), _to_json(v, f"{where}[{key!r}]")] for key, v in value.items()]
        if type(value) is collections.Counter:
            return {_COUNTER_TAG: items}
        if type(value) is not dict:
            raise TypeError(f"{where} is a {type(value).__name__}; a training state holds dicts and Counters")
        if all(isinstance(key, str) for key in value):
            return {key: v for key, (_, v) in zip(value, items)}
        return {_ITEMS_TAG: items}
    raise TypeError(f"{where} is a {type(value).__name__}; a training state holds schedulers whose state is "
                    "None, bool, int, float, str, lists, tuples, dicts and Counters of these (a lambda in "
                    "LambdaLR is not saved by torch either: it is rebuilt by the code that builds the scheduler)")


def _from_json(value):
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and _FLOAT_TAG in value:
            text = value[_FLOAT_TAG]
            if text not in ("inf", "-inf", "nan"):
                raise ValueError(f"{{{_FLOAT_TAG!r}: {text!r}}} is not a tagged non-finite float")
            return float(text)
        if len(value) == 1 and _TUPLE_TAG in value:
            return tuple(_from_json(v) for v in value[_TUPLE_TAG])
        if len(value) == 1 and (_ITEMS_TAG in value or _COUNTER_TAG in value):
            tag = next(iter(value))
            pairs = value[tag]
            if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise ValueError(f"{{{tag!r}: ...}} does not hold [key, value] pairs")
            items = {_from_json(key): _from_json(v) for key, v in pairs}
            return collections.Counter(items) if tag == _COUNTER_TAG else items
        return {key: _from_json(v) for key, v in value.items()}
    return value


# ---- GradScaler -----------------------------------------------------------------------------------
def check_scaler(scaler) -> None:
    if scaler is not None and not isinstance(scaler, (torch.amp.GradScaler, _amp.GradScaler)):
        raise TypeError(f"scaler must be a torch.amp.GradScaler or torchbridge.amp.GradScaler or None, "
                        f"got {type(scaler).__name__}")


def encode_scaler(scaler) -> "str | None":
    """The JSON entry, or None for a disabled scaler (its state_dict is empty, and a disabled scaler
    ignores what it loads), so the file records no scaler as the C++ side would."""
    state = scaler.state_dict()
    if not state:
        return None
    return json.dumps({field: state[field] for field in _SCALER_FIELDS}, allow_nan=False)


def decode_scaler(path: str, header: "dict[str, str]", scaler) -> "dict | None":
    """The state to load into ``scaler``, checked now; None when nothing is to be loaded (a
    disabled scaler). An enabled scaler and a file without one is an error, as torch's
    load_state_dict of an empty state is."""
    text = header.get(SCALER_KEY)
    if text is None:
        if scaler.is_enabled():
            raise ValueError(f"{path}: the state was saved without a GradScaler state (or from a disabled one), "
                             "but an enabled GradScaler was given")
        return None
    try:
        state = json.loads(text)
    except ValueError as error:
        raise ValueError(f"{path}: metadata '{SCALER_KEY}' is not JSON ({error})") from None
    if not isinstance(state, dict) or sorted(state) != sorted(_SCALER_FIELDS):
        raise ValueError(f"{path}: metadata '{SCALER_KEY}' is {text[:120]!r}; expected an object with exactly "
                         f"{', '.join(_SCALER_FIELDS)}")
    return state if scaler.is_enabled() else None
