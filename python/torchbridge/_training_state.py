"""A Python training run's state in one safetensors file: ``checkpoint.save_training_state`` /
``checkpoint.load_training_state`` (and their older, shorter forms ``save_state`` / ``load_state``).

The layout is the C++ core's (src/checkpoint/training_state.cpp), so both read the same names:
``model.<name>`` for parameters and persistent buffers, ``optimizer.<i>.<field>`` for optimizer
state, ``rng.cpu`` / ``rng.<device>`` for generator states, and in ``__metadata__``: ``format``,
``torchbridge.step``, ``torchbridge.epoch``, ``torchbridge.optimizer`` (JSON), ``torchbridge.source_*``,
``user.<key>``, and when given ``torchbridge.lr_scheduler`` / ``torchbridge.grad_scaler`` (JSON,
see _training_extras). The file is written by the C++ writer (atomic replacement)."""

import dataclasses
import functools
import json
import re
import warnings

import torch

from . import _optimizer_state, _placement
from . import _training_extras as _extras
from .backends.base import detect_best_backend
from . import _safetensors_io as _files

FORMAT = "torchbridge.training_state/1"
_MODEL = "model."
_RNG = "rng."


@dataclasses.dataclass(frozen=True)
class TrainingProgress:
    """What ``load_state`` returns: the saved counters and user metadata, where the run was saved,
    and what the restore did (names skipped under ``strict=False``, generators restored)."""

    step: int
    epoch: int
    metadata: "dict[str, str]"  # the ``extra`` (``metadata``) dict given when saving
    source_backend: str
    source_devices: "dict[str, str]"
    source_dtypes: "dict[str, torch.dtype]"
    missing_keys: "list[str]" = dataclasses.field(default_factory=list)
    unexpected_keys: "list[str]" = dataclasses.field(default_factory=list)
    restored_rng: "list[str]" = dataclasses.field(default_factory=list)

    @property
    def extra(self) -> "dict[str, str]":
        """The ``extra`` dict given to ``save_training_state`` (the same as ``metadata``)."""
        return self.metadata


# ---- saving ---------------------------------------------------------------------------------------
def save_training_state(path, model: torch.nn.Module, optimizer: "torch.optim.Optimizer | None" = None,
                        scheduler: "torch.optim.lr_scheduler.LRScheduler | None" = None, scaler=None, *,
                        step: int = 0, epoch: int = 0, extra: "dict[str, str] | None" = None) -> str:
    """Writes ``model``'s parameters and persistent buffers, ``optimizer``'s state (any
    torch.optim optimizer whose state is tensors and JSON values, or torchbridge.memory's
    OffloadedAdam/AdamW, recorded as Adam/AdamW), ``scheduler``'s state (an LR
    scheduler of ``optimizer``), ``scaler``'s state (torch.amp.GradScaler or
    torchbridge.amp.GradScaler), the CPU generator and the current accelerator's generators,
    ``step``/``epoch``, ``extra`` (str -> str) and the source backend, devices and dtypes to
    ``path``, atomically. Returns the path."""
    return _save(path, model, optimizer, scheduler, scaler, step, epoch, extra)


def save_state(path, model: torch.nn.Module, optimizer: "torch.optim.Optimizer | None" = None, *,
               step: int = 0, epoch: int = 0, metadata: "dict[str, str] | None" = None) -> str:
    """``save_training_state`` without a scheduler or scaler (``metadata`` is its ``extra``)."""
    return _save(path, model, optimizer, None, None, step, epoch, metadata)


def _save(path, model, optimizer, scheduler, scaler, step, epoch, metadata) -> str:
    path = _files.check_path(path)
    _check_model(model)
    _check_optimizer(optimizer)
    _extras.check_scheduler(scheduler, optimizer)
    _extras.check_scaler(scaler)
    for label, value in (("step", step), ("epoch", epoch)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{label} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{label} must be >= 0, got {value}")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of str to str, got {type(metadata).__name__}")
    user = dict(metadata or {})
    for key, value in user.items():
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise TypeError(f"metadata maps non-empty str keys to str values (as the C++ training state does), "
                            f"got {key!r}: {value!r}")

    tensors, devices, dtypes = {}, {}, {}
    for name, tensor in _named_state(model).items():
        tensors[_MODEL + name] = tensor.detach()
        devices[name] = str(tensor.device)
        dtypes[name] = _c10_name(tensor.dtype)
    header = {
        "format": FORMAT,
        "torchbridge.writer": "python",
        "torchbridge.step": str(step),
        "torchbridge.epoch": str(epoch),
        "torchbridge.source_devices": json.dumps(devices),
        "torchbridge.source_dtypes": json.dumps(dtypes),
        "torchbridge.source_backend": detect_best_backend(),  # Python's: it also sees TPUs
    }
    if optimizer is not None:
        optimizer_tensors, header["torchbridge.optimizer"] = _optimizer_state.encode(optimizer)
        tensors.update(optimizer_tensors)
    tensors[_RNG + "cpu"] = torch.get_rng_state()
    for device in _accelerator_devices():
        tensors[_RNG + str(device)] = torch.get_device_module(device.type).get_rng_state(device.index)
    if scheduler is not None:
        header[_extras.SCHEDULER_KEY] = _extras.encode_scheduler(scheduler)
    if scaler is not None and (scaler_json := _extras.encode_scaler(scaler)) is not None:
        header[_extras.SCALER_KEY] = scaler_json
    header.update({"user." + key: value for key, value in user.items()})
    _files.save(path, tensors, metadata=header)
    return path


# ---- loading --------------------------------------------------------------------------------------
def load_training_state(path, model: torch.nn.Module, optimizer: "torch.optim.Optimizer | None" = None,
                        scheduler: "torch.optim.lr_scheduler.LRScheduler | None" = None, scaler=None, *,
                        device_map=None, dtype_policy: str = "keep", strict: bool = True) -> TrainingProgress:
    """Restores a state written by ``save_training_state`` (or by the C++ ``save_training_state``)
    into ``model``, ``optimizer``, ``scheduler`` and ``scaler``, plus the generators this process
    has, and returns the progress.

    ``device_map``: None (tensors stay on the devices the model has them on), a dict of module-name
    prefix -> device (longest prefix wins, "" matches all; a prefix that matches no module or tensor
    is an error, and so is a map that places tied tensors apart), "auto" or "auto:<backend>"
    (top-level modules spread over the backend's devices by free memory; tied names go together, and
    a top-level module holding no saved tensor goes to the first device). Tensors the file does not
    hold (non-persistent buffers; under ``strict=False`` the names it lacks) move where the map sends
    their module, keeping their values and dtypes, as ``model.to(device)`` moves them.
    ``dtype_policy``: "keep", "cast:<dtype>" or "convert_unsupported", for the tensors read from the
    file. ``strict=False`` skips model names only one side has (listed in the result); shapes and the
    optimizer must match regardless.

    A scheduler or scaler given must have been saved (a disabled scaler loads nothing, as in
    torch). Everything is checked, and every tensor is read, converted and placed, before the
    model, the optimizer, the scheduler, the scaler or a generator changes; a failure leaves all of
    them as they were. Gradients are cleared, since they belong to the replaced weights."""
    return _load(path, model, optimizer, scheduler, scaler, device_map, dtype_policy, strict)


def load_state(path, model: torch.nn.Module, optimizer: "torch.optim.Optimizer | None" = None, *,
               device_map=None, dtype_policy: str = "keep", strict: bool = True) -> TrainingProgress:
    """``load_training_state`` without a scheduler or scaler."""
    return _load(path, model, optimizer, None, None, device_map, dtype_policy, strict)


def _load(path, model, optimizer, scheduler, scaler, device_map, dtype_policy, strict) -> TrainingProgress:
    path = _files.check_path(path)
    _check_model(model)
    _check_optimizer(optimizer)
    _extras.check_scheduler(scheduler, optimizer)
    _extras.check_scaler(scaler)
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
    policy = _placement.DtypePolicy(dtype_policy)
    header = _files.metadata(path)
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: not a TorchBridge training state (metadata format is "
                         f"{header.get('format')!r}, expected {FORMAT!r})")
    progress = _progress_of(path, header)
    saved = _files.load(path)  # CPU tensors aliasing the file's private mapping: no data read yet

    model_state = _named_state(model)
    on_meta = [name for name, tensor in model_state.items() if tensor.is_meta]
    if on_meta:
        # Their .data cannot be set to real tensors (torch: "incompatible tensor type"), and staged
        # like them they would load nothing: a silent no-op without a device map.
        raise ValueError(f"{path}: the model's {on_meta[0]!r}" + (f" and {len(on_meta) - 1} more" if len(on_meta) > 1
                                                                  else "")
                         + " are on the meta device, which holds no data to load into; make the model's tensors "
                           "real first (model.to_empty(device='cpu')), then load the state, with a device_map to "
                           "place them elsewhere")
    saved_names = {name[len(_MODEL):] for name in saved if name.startswith(_MODEL)}
    missing = [name for name in model_state if name not in saved_names]
    unexpected = sorted(saved_names - model_state.keys())
    if strict and (missing or unexpected):
        raise ValueError(f"{path}: " + "; ".join(
            [f"the model has '{n}' but the state does not" for n in missing]
            + [f"the state has '{n}' but the model does not" for n in unexpected]))
    for name, tensor in model_state.items():
        if name in saved_names and saved[_MODEL + name].shape != tensor.shape:
            raise ValueError(f"{path}: '{name}' was saved with shape {list(saved[_MODEL + name].shape)} but the "
                             f"model's is {list(tensor.shape)}")

    optimizer_state = None
    if optimizer is not None:
        if "torchbridge.optimizer" not in header:
            raise ValueError(f"{path}: the state was saved without an optimizer, but one was given")
        optimizer_state = _optimizer_state.decode(
            path, header["torchbridge.optimizer"],
            {n: t for n, t in saved.items() if n.startswith(_optimizer_state.PREFIX)}, optimizer,
            written_by_cpp=header.get("torchbridge.writer") != "python")

    scheduler_state = None
    if scheduler is not None:
        if _extras.SCHEDULER_KEY not in header:
            raise ValueError(f"{path}: the state was saved without an LR scheduler, but one was given")
        scheduler_state = _extras.decode_scheduler(path, header[_extras.SCHEDULER_KEY])
    scaler_state = _extras.decode_scaler(path, header, scaler) if scaler is not None else None

    loaded = [name for name in model_state if name in saved_names]
    # Every tensor of the model is placed, not only those the file holds: a BERT whose non-persistent
    # position_ids stayed on the CPU could not run on the device its weights went to.
    tensors = {**model_state, **_non_persistent_buffers(model, model_state)}
    auto = isinstance(device_map, str)
    device_map = _placement.parse_device_map(device_map, [(n, model_state[n].nbytes) for n in loaded])
    if auto:
        device_map = _complete_auto_map(device_map, model, tensors)
    _check_device_map_matches(device_map, model, tensors)
    rng = _rng_to_restore(path, saved)
    # Stage: every tensor read, converted and on its device before anything changes.
    staged = {}
    applied = {}  # factor name -> the fp8 tensor widened with it
    for name in loaded:
        tensor = saved[_MODEL + name]
        device = _placement.device_for(name, device_map, model_state[name].device)
        converted, factor = _placement.widen(tensor, policy.dtype_for(tensor.dtype, device),
                                             lambda key: saved.get(_MODEL + key), name)
        if factor is not None:
            applied[factor] = name
        # Laid out as the tensor it replaces (a channels_last weight stays channels_last, as
        # load_state_dict's in-place copy keeps it): memory order decides, e.g., dropout's mask.
        target = model_state[name]
        if converted.shape == target.shape:
            staged[name] = torch.empty_like(target, dtype=converted.dtype, device=device).copy_(converted)
        else:
            staged[name] = converted.to(device, copy=True)
    # The rest is moved, not loaded, and in its own dtype: the dtype policy says what becomes of the
    # dtypes the file holds, and these are the model's own values in the dtypes its code chose
    # (transformers keeps a rotary inv_freq in float32 in a bfloat16 model on purpose).
    moved = {}
    for name, tensor in tensors.items():
        device = _placement.device_for(name, device_map, tensor.device)
        if name not in staged and device != tensor.device:
            moved[name] = tensor.detach().to(device)

    # A widened fp8 tensor holds real values now; the model's own copy of its factor, applied again
    # by its forward, would scale them twice (each block's output off by its factor): it becomes 1.
    absorbed = sorted(factor for factor in applied if factor in staged)
    for factor in absorbed:
        staged[factor] = torch.ones_like(staged[factor])
    if absorbed:
        warnings.warn(f"{path}: dequantized {', '.join(repr(applied[f]) for f in absorbed)} with "
                      f"{', '.join(repr(f) for f in absorbed)}; the model's "
                      f"{'copies of those factors are' if len(absorbed) > 1 else 'copy of that factor is'} set to 1, "
                      f"so that a forward that applies them does not scale the values twice", stacklevel=3)

    # Commit; the only step that can still fail (placing optimizer state on the devices) comes
    # last, and everything before it is undone if it does.
    previous_rng = {key: get() for key, (get, _, _) in rng.items()}
    previous = {name: (tensors[name].data, tensors[name].grad) for name in [*staged, *moved]}
    # Stateful objects that loaded, with their earlier state_dicts (load_state_dict copies what it
    # is given, so those reload as they were); undone in reverse if a later one fails.
    undo = []
    try:
        for key, (_, set_state, state) in rng.items():
            set_state(state)
        with torch.no_grad():
            for name, tensor in [*staged.items(), *moved.items()]:
                tensors[name].data = tensor
                tensors[name].grad = None  # on the old device, or of the replaced weights
        for target, state in ((optimizer, optimizer_state), (scheduler, scheduler_state), (scaler, scaler_state)):
            if target is not None and state is not None:
                earlier = target.state_dict()
                target.load_state_dict(state)
                undo.append((target, earlier))
    except BaseException:
        for target, earlier in reversed(undo):
            target.load_state_dict(earlier)
        for name, (data, grad) in previous.items():
            tensors[name].data = data
            tensors[name].grad = grad
        for key, (_, set_state, _) in rng.items():
            set_state(previous_rng[key])
        raise

    return TrainingProgress(**progress, source_backend=header.get("torchbridge.source_backend", ""),
                            metadata={k[len("user."):]: v for k, v in header.items() if k.startswith("user.")},
                            missing_keys=missing, unexpected_keys=unexpected, restored_rng=sorted(rng))


def _progress_of(path, header) -> dict:
    """The step, epoch and source devices and dtypes the header records, each checked: read before
    anything is loaded, so a file whose metadata is wrong changes nothing (they were read after the
    model, optimizer and random state had changed)."""
    def refuse(key, expected):
        raise ValueError(f"{path}: metadata {key} is {header[key]!r}; expected {expected}")

    progress = {}
    for field in ("step", "epoch"):
        key = f"torchbridge.{field}"
        value = header.get(key, "0")
        if re.fullmatch(r"-?[0-9]+", value) is None:  # C++'s writer takes any int64
            refuse(key, "an integer")
        progress[field] = int(value)
    for field, check in (("source_devices", lambda d: isinstance(d, str)),
                         ("source_dtypes", lambda d: isinstance(d, str) and d in _dtypes_by_c10_name())):
        key = f"torchbridge.{field}"
        try:
            entries = json.loads(header.get(key, "{}"))
        except ValueError:
            refuse(key, "a JSON object")
        if not isinstance(entries, dict) or not all(isinstance(n, str) and check(d) for n, d in entries.items()):
            refuse(key, "a JSON object of tensor names to " + ("devices" if field == "source_devices" else
                                                                "torch dtype names (c10's, e.g. Float)"))
        progress[field] = entries
    progress["source_dtypes"] = {n: _dtypes_by_c10_name()[d] for n, d in progress["source_dtypes"].items()}
    return progress


# ---- helpers --------------------------------------------------------------------------------------
def _check_model(model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for name, module in model.named_modules():
        # Extra state is arbitrary Python; the file holds tensors and strings only.
        if type(module).get_extra_state is not torch.nn.Module.get_extra_state:
            raise NotImplementedError(f"module '{name}' ({type(module).__name__}) has extra state "
                                      "(get_extra_state), which a training state cannot hold")


def _check_optimizer(optimizer) -> None:
    from .memory import _OffloadedAdamFamily  # keeps torch.optim.Adam's state, in its format

    if optimizer is not None and not isinstance(optimizer, (torch.optim.Optimizer, _OffloadedAdamFamily)):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, torchbridge.memory.OffloadedAdam(W) or None, "
                        f"got {type(optimizer).__name__}")


def _complete_auto_map(device_map, model: torch.nn.Module, tensors) -> "list[tuple[str, torch.device]]":
    """The auto map, made (as the C++ restore makes it) from the tensors the file holds under their
    first names, completed so that it places the whole model and follows its own rule: a top-level
    module holding only tensors the file lacks (LlamaModel's rotary_emb) goes to the first device,
    where the inputs and the embeddings go, and every other name of a tied tensor (an output head
    tied to the embedding, a module registered twice) goes with its first name. Without that they
    stayed where the model had them, and a tied model was refused for a map the caller never wrote."""
    if not device_map:
        return device_map
    completed = list(device_map)
    for top in dict.fromkeys(name.split(".")[0] for name in tensors):
        if _placement.device_for(top, completed, None) is None:
            completed.append((top + ".", device_map[0][1]))
    first_names = {id(tensor): name for name, tensor in tensors.items()}
    for alias, tensor in [*model.named_parameters(remove_duplicate=False),
                          *model.named_buffers(remove_duplicate=False)]:
        first = first_names.get(id(tensor))
        if first is not None and first != alias:
            completed.append((alias, _placement.device_for(first, completed, tensor.device)))
    return completed


def _check_device_map_matches(device_map, model: torch.nn.Module, tensors) -> None:
    """Every device_map prefix names a module or tensor of ``model`` (matched as ``device_for``
    matches): a mistyped one would otherwise move nothing, silently. A module without tensors is
    accepted (accelerate's maps name such modules too). Tied tensors are saved and placed once,
    under their first name: a map that asks another device for another of their names (lm_head on
    the CPU, the embedding it is tied to on emu:0) is refused, as it would not be followed.
    ``tensors``: each tensor of the model once, under its first name."""
    placed_as = {id(tensor): name for name, tensor in tensors.items()}
    # Every name of every tensor (a tied one has several).
    aliases = [(name, tensor) for name, tensor in [*model.named_parameters(remove_duplicate=False),
                                                   *model.named_buffers(remove_duplicate=False)]
               if id(tensor) in placed_as]
    # The model itself is "", matched by "".
    paths = [*(name for name, _ in model.named_modules()), *tensors, *(name for name, _ in aliases)]
    for prefix, device in device_map:
        if not any(_placement.device_for(path, [(prefix, device)], None) is not None for path in paths):
            top = sorted({path.split(".")[0] for path in paths if path})
            shown = ", ".join(repr(name) for name in top[:10]) + (", ..." if len(top) > 10 else "")
            raise ValueError(f"device_map[{prefix!r}] matches no module or tensor of the model; prefixes are "
                             f"module paths such as {shown} (or '' for all)")
    for alias, tensor in aliases:
        first = placed_as[id(tensor)]
        if first == alias:
            continue
        wanted, placed = (_placement.device_for(name, device_map, tensor.device) for name in (alias, first))
        if wanted != placed:
            raise ValueError(f"device_map places '{alias}' on {wanted}, but it is tied to '{first}', which the map "
                             f"places on {placed}; tied tensors are one tensor, saved and placed under '{first}': "
                             f"give both names one device")




def _named_state(model: torch.nn.Module) -> "dict[str, torch.Tensor]":
    """Parameters, then persistent buffers, as the C++ layout orders them (tied tensors once,
    under their first name). Non-persistent buffers are derived values, as in state_dict()."""
    state = dict(model.named_parameters())
    for name, buffer in model.named_buffers():
        owner, _, attribute = name.rpartition(".")
        if attribute not in model.get_submodule(owner)._non_persistent_buffers_set:
            state[name] = buffer
    return state


def _non_persistent_buffers(model: torch.nn.Module, model_state) -> "dict[str, torch.Tensor]":
    """The buffers state_dict() leaves out (BERT's position_ids, a rotary embedding's inv_freq), each
    once, under its first name, less any that is a tensor of ``model_state`` too."""
    held = {id(tensor) for tensor in model_state.values()}
    return {name: buffer for name, buffer in model.named_buffers() if id(buffer) not in held}


def _accelerator_devices() -> "list[torch.device]":
    """Every device of the current accelerator (CUDA, an SDK device such as emu, ...), if any."""
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None:
        return []
    return [torch.device(accelerator.type, i) for i in range(torch.accelerator.device_count())]


def _rng_to_restore(path: str, saved: "dict[str, torch.Tensor]") -> dict:
    """{key: (get_state, set_state, saved_state)} for the generators in the file that exist here:
    the CPU's and the current accelerator's devices. Others (a backend this process lacks) are
    skipped, as in C++. State sizes are checked now, so setting them cannot fail later."""
    generators = {_RNG + "cpu": (torch.get_rng_state, torch.set_rng_state)}
    for device in _accelerator_devices():
        module, index = torch.get_device_module(device.type), device.index
        generators[_RNG + str(device)] = (lambda m=module, i=index: m.get_rng_state(i),
                                          lambda state, m=module, i=index: m.set_rng_state(state, i))
    restore = {}
    for key, (get_state, set_state) in generators.items():
        if key not in saved:
            continue
        state, current = saved[key], get_state()
        if state.dtype != torch.uint8 or state.shape != current.shape:
            raise ValueError(f"{path}: '{key}' holds {state.numel()} {state.dtype} values, but this generator's "
                             f"state is {current.numel()} uint8 values")
        restore[key] = (get_state, set_state, state.clone())
    return restore


def _c10_name(dtype: torch.dtype) -> str:
    """The C++ ScalarType name ("Float", "BFloat16"), which the C++ writer records."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


@functools.lru_cache(maxsize=None)
def _dtypes_by_c10_name() -> "dict[str, torch.dtype]":
    table = {}
    with warnings.catch_warnings():  # creating quantized or complex32 tensors warns; nothing is computed
        warnings.simplefilter("ignore")
        for value in vars(torch).values():
            if isinstance(value, torch.dtype):
                try:
                    table[_c10_name(value)] = value
                except (RuntimeError, TypeError):
                    continue  # dtypes without a dense CPU tensor (e.g. sub-byte ones) are never saved
    return table
