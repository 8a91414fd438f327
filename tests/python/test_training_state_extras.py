"""checkpoint.save_training_state / load_training_state with an LR scheduler and a GradScaler:
a run interrupted and resumed continues bit-identically to an uninterrupted one (parameters, the
learning rates, the scale, skipped steps) on cpu and emu; the states pass through the C++ core
unchanged and a C++ GradScaler's state resumes in Python and back; bad input is refused before
anything changes."""

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

import torchbridge
from torchbridge import checkpoint

from test_training_state import cpp, cpp_run_model

os.environ.setdefault("TORCHBRIDGE_EMU_GUARDED", "1")
torchbridge.devices.load("emu")  # before this process's first backward pass

SCHEDULERS = {
    "StepLR": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    "OneCycleLR": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=12),
    "CosineAnnealingWarmRestarts": lambda opt: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=3),
    "SequentialLR": lambda opt: torch.optim.lr_scheduler.SequentialLR(
        opt, [torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=3),
              torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)], milestones=[3]),
    # Its milestones are a Counter (epoch -> count) with int keys: refused until 2026-11-29. A plain
    # dict back would raise KeyError at the first epoch that is not a milestone.
    "MultiStepLR": lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 5, 9], gamma=0.5),
    "ChainedScheduler": lambda opt: torch.optim.lr_scheduler.ChainedScheduler(
        [torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[4, 8]), torch.optim.lr_scheduler.ExponentialLR(opt, 0.95)],
        optimizer=opt),
    # Its state holds infinities (best, mode_worse), which strict JSON cannot.
    "ReduceLROnPlateau": lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5),
}
SKIPPED_STEP = 6  # the loss is made inf there: the scaler skips the step and backs off


def make_run(seed: int, device: str, scheduler_name: str, scaler_class=torch.amp.GradScaler):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer, SCHEDULERS[scheduler_name](optimizer), scaler_class(device, growth_interval=2)


def train(run, first_step: int, steps: int, device: str) -> None:
    model, optimizer, scheduler, scaler = run
    for step in range(first_step, first_step + steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(torch.randn(16, 6).to(device)), torch.randn(16, 2).to(device))
        scaler.scale(loss * (math.inf if step == SKIPPED_STEP else 1.0)).backward()
        scaler.step(optimizer)
        scaler.update()
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step(loss.item())
        else:
            scheduler.step()


@pytest.mark.parametrize("device", ["cpu", "emu"])
@pytest.mark.parametrize("scheduler_name", sorted(SCHEDULERS))
def test_resume_with_scheduler_and_scaler_is_bit_identical(tmp_path, device, scheduler_name):
    torch.manual_seed(0)
    reference = make_run(1, device, scheduler_name)
    train(reference, 0, 10, device)

    torch.manual_seed(0)
    first = make_run(1, device, scheduler_name)
    train(first, 0, 5, device)
    checkpoint.save_training_state(tmp_path / "run.safetensors", *first, step=5, extra={"note": "half"})
    resumed = make_run(2, device, scheduler_name)
    torch.manual_seed(123)  # the batches' generator must come back from the file
    progress = checkpoint.load_training_state(tmp_path / "run.safetensors", *resumed)
    assert (progress.step, progress.extra) == (5, {"note": "half"})
    assert resumed[2].state_dict() == first[2].state_dict()
    assert resumed[3].state_dict() == first[3].state_dict()
    train(resumed, 5, 5, device)

    for (name, want), got in zip(reference[0].state_dict().items(), resumed[0].state_dict().values()):
        assert torch.equal(got.cpu(), want.cpu()), name
    assert resumed[1].param_groups[0]["lr"] == reference[1].param_groups[0]["lr"]
    assert resumed[2].state_dict() == reference[2].state_dict()
    assert resumed[3].state_dict() == reference[3].state_dict()
    # The inf step backed the scale off once: 65536 * 2^(clean steps // 2) / 2.
    assert reference[3].get_scale() < 65536 * 2 ** 4


def test_torchbridge_grad_scaler_state_resumes_into_torchs(tmp_path):
    """The file holds torch's state_dict layout, so either scaler class reads the other's."""
    torch.manual_seed(0)
    first = make_run(1, "emu", "StepLR", torchbridge.amp.GradScaler)
    train(first, 0, 5, "emu")
    checkpoint.save_training_state(tmp_path / "run.safetensors", *first)
    resumed = make_run(2, "emu", "StepLR", torch.amp.GradScaler)
    checkpoint.load_training_state(tmp_path / "run.safetensors", *resumed)
    assert resumed[3].state_dict() == first[3].state_dict()
    assert resumed[3].get_scale() == first[3].get_scale() != 65536.0


def test_metadata_is_strict_json_with_tagged_infinities(tmp_path):
    run = make_run(1, "cpu", "ReduceLROnPlateau")
    train(run, 0, 3, "cpu")
    checkpoint.save_training_state(tmp_path / "run.safetensors", *run)
    with safe_open(tmp_path / "run.safetensors", "pt") as f:
        header = f.metadata()
    scheduler = json.loads(header["torchbridge.lr_scheduler"])  # json.loads accepts Infinity; check the text
    assert "Infinity" not in header["torchbridge.lr_scheduler"]
    assert scheduler["mode_worse"] == {"__float__": "inf"}
    assert json.loads(header["torchbridge.grad_scaler"]) == run[3].state_dict()


def test_disabled_scaler_records_nothing_and_loads_nothing(tmp_path):
    model, optimizer, scheduler, _ = make_run(1, "cpu", "StepLR")
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    checkpoint.save_training_state(tmp_path / "run.safetensors", model, optimizer, scheduler, disabled)
    assert "torchbridge.grad_scaler" not in checkpoint.metadata(tmp_path / "run.safetensors")
    checkpoint.load_training_state(tmp_path / "run.safetensors", model, optimizer, scheduler,
                                   torch.amp.GradScaler("cpu", enabled=False))
    with pytest.raises(ValueError, match="saved without a GradScaler state .* but an enabled GradScaler was given"):
        checkpoint.load_training_state(tmp_path / "run.safetensors", model, optimizer, scheduler,
                                       torch.amp.GradScaler("cpu"))


# ---- through the C++ core (tests/cpp/training_state_interop.cpp) -------------------------------------
def cpp_scaled_train(model, optimizer, scaler, steps: int) -> None:
    """The C++ helper's --scaler loop: its fixed batch, loss scaling with growth_interval 2."""
    torch.manual_seed(99)
    x, y = torch.randn(16, 6), torch.randn(16, 2)
    for _ in range(steps):
        optimizer.zero_grad()
        scaler.scale(F.mse_loss(model(x), y)).backward()
        scaler.step(optimizer)
        scaler.update()


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def test_scheduler_and_scaler_pass_through_cpp_unchanged(tmp_path):
    torch.manual_seed(0)
    reference = make_run(1, "cpu", "OneCycleLR")
    train(reference, 0, 10, "cpu")
    torch.manual_seed(0)
    first = make_run(1, "cpu", "OneCycleLR")
    train(first, 0, 5, "cpu")
    checkpoint.save_training_state(tmp_path / "python.safetensors", *first, step=5)
    cpp("rewrite", tmp_path / "python.safetensors", tmp_path / "cpp.safetensors", "SGD")
    written, rewritten = (checkpoint.metadata(tmp_path / name) for name in ("python.safetensors", "cpp.safetensors"))
    assert rewritten["torchbridge.lr_scheduler"] == written["torchbridge.lr_scheduler"]
    assert json.loads(rewritten["torchbridge.grad_scaler"]) == json.loads(written["torchbridge.grad_scaler"])

    resumed = make_run(2, "cpu", "OneCycleLR")
    checkpoint.load_training_state(tmp_path / "cpp.safetensors", *resumed)
    train(resumed, 5, 5, "cpu")
    for (name, want), got in zip(reference[0].state_dict().items(), resumed[0].state_dict().values()):
        assert torch.equal(got, want), name
    assert resumed[2].state_dict() == reference[2].state_dict()
    assert resumed[3].state_dict() == reference[3].state_dict()


def test_cpp_grad_scaler_resumes_in_python_and_python_in_cpp(tmp_path):
    # Uninterrupted in Python: 10 scaled SGD steps.
    reference = cpp_run_model(1)
    reference_scaler = torch.amp.GradScaler("cpu", growth_interval=2)
    cpp_scaled_train(reference, sgd(reference), reference_scaler, 10)

    # C++ trains 5 steps with its own GradScaler (from LibTorch's initial weights, not Python's);
    # Python resumes with torch's and ends where C++ resuming its own file ends.
    cpp("save", tmp_path / "cpp.safetensors", "SGD", 5, "--scaler")
    cpp("resume", tmp_path / "cpp.safetensors", "SGD", 5, tmp_path / "cpp_direct.safetensors", "--scaler")
    direct = checkpoint.load(tmp_path / "cpp_direct.safetensors")
    model = cpp_run_model(3)
    optimizer, scaler = sgd(model), torch.amp.GradScaler("cpu", growth_interval=2)
    checkpoint.load_training_state(tmp_path / "cpp.safetensors", model, optimizer, scaler=scaler)
    assert scaler.get_scale() == 65536.0 * 2 ** 2  # two growths in 5 clean steps
    cpp_scaled_train(model, optimizer, scaler, 5)
    assert scaler.state_dict() == reference_scaler.state_dict()
    assert direct.pop("scale").item() == scaler.get_scale()
    for name, want in direct.items():
        assert torch.equal(model.state_dict()[name], want), name

    # Python trains 5 steps; C++ resumes with its GradScaler.
    model = cpp_run_model(1)
    optimizer, scaler = sgd(model), torch.amp.GradScaler("cpu", growth_interval=2)
    cpp_scaled_train(model, optimizer, scaler, 5)
    checkpoint.save_training_state(tmp_path / "python.safetensors", model, optimizer, scaler=scaler, step=5)
    cpp("resume", tmp_path / "python.safetensors", "SGD", 5, tmp_path / "out.safetensors", "--scaler")
    resumed = checkpoint.load(tmp_path / "out.safetensors")
    assert resumed.pop("scale").item() == reference_scaler.get_scale()
    for name, want in reference.state_dict().items():
        assert torch.equal(resumed[name], want), name


def test_cpp_refuses_a_malformed_scaler_state(tmp_path):
    model = cpp_run_model(1)
    optimizer = sgd(model)
    scaler = torch.amp.GradScaler("cpu")
    cpp_scaled_train(model, optimizer, scaler, 2)
    checkpoint.save_training_state(tmp_path / "good.safetensors", model, optimizer, scaler=scaler)
    tensors, header = checkpoint.load(tmp_path / "good.safetensors"), checkpoint.metadata(tmp_path / "good.safetensors")
    header["torchbridge.grad_scaler"] = json.dumps({"scale": 2.0})
    checkpoint.save(tmp_path / "bad.safetensors", tensors, metadata=header)
    with pytest.raises(AssertionError, match="has 1 entries; a GradScaler state has scale"):
        cpp("resume", tmp_path / "bad.safetensors", "SGD", 1, tmp_path / "out.safetensors", "--scaler")
    assert not (tmp_path / "out.safetensors").exists()


# ---- bad input ---------------------------------------------------------------------------------------
def snapshot(run):
    model, optimizer, scheduler, scaler = run
    return ({n: t.detach().clone() for n, t in model.state_dict().items()},
            {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
             for i, s in optimizer.state_dict()["state"].items()},
            optimizer.param_groups[0]["lr"], scheduler.state_dict(), scaler.state_dict())


def assert_unchanged(before, run):
    after = snapshot(run)
    for name in before[0]:
        assert torch.equal(before[0][name], after[0][name]), name
    assert before[1].keys() == after[1].keys()
    for i in before[1]:
        for key, value in before[1][i].items():
            assert torch.equal(value, after[1][i][key]) if torch.is_tensor(value) else value == after[1][i][key]
    assert before[2:] == after[2:]


def test_bad_input_is_refused_and_changes_nothing(tmp_path):
    saved = make_run(1, "cpu", "StepLR")
    train(saved, 0, 3, "cpu")
    path = tmp_path / "run.safetensors"
    checkpoint.save_training_state(path, *saved)
    target = make_run(2, "cpu", "StepLR")
    train(target, 0, 4, "cpu")
    before = snapshot(target)

    # A scheduler of another optimizer.
    other = torch.optim.SGD(target[0].parameters(), lr=0.1)
    with pytest.raises(ValueError, match="schedules a different optimizer than the one given"):
        checkpoint.load_training_state(path, target[0], target[1], SCHEDULERS["StepLR"](other))
    with pytest.raises(TypeError, match="scheduler must be a torch.optim.lr_scheduler.LRScheduler or None, got str"):
        checkpoint.load_training_state(path, target[0], target[1], "StepLR")
    with pytest.raises(TypeError, match="scaler must be a torch.amp.GradScaler or torchbridge.amp.GradScaler"):
        checkpoint.load_training_state(path, target[0], target[1], target[2], 65536.0)
    # A state saved without a scheduler.
    checkpoint.save_training_state(tmp_path / "no_scheduler.safetensors", saved[0], saved[1], scaler=saved[3])
    with pytest.raises(ValueError, match="saved without an LR scheduler, but one was given"):
        checkpoint.load_training_state(tmp_path / "no_scheduler.safetensors", *target)
    assert_unchanged(before, target)

    # Crafted metadata, and a scaler state torchbridge's GradScaler refuses while committing: the
    # model, optimizer and scheduler already loaded are put back.
    tensors, header = checkpoint.load(path), checkpoint.metadata(path)
    for key, value, error in [
        ("torchbridge.lr_scheduler", "{not json", "'torchbridge.lr_scheduler' is not a scheduler state"),
        ("torchbridge.lr_scheduler", "[1, 2]", "'torchbridge.lr_scheduler' is not a scheduler state \\(a list\\)"),
        ("torchbridge.grad_scaler", json.dumps({"scale": 1.0}), "expected an object with exactly scale, growth_factor"),
    ]:
        checkpoint.save(tmp_path / "crafted.safetensors", tensors, metadata={**header, key: value})
        with pytest.raises(ValueError, match=error):
            checkpoint.load_training_state(tmp_path / "crafted.safetensors", *target)
        assert_unchanged(before, target)
    zero_scale = {**json.loads(header["torchbridge.grad_scaler"]), "scale": 0.0}
    checkpoint.save(tmp_path / "zero.safetensors", tensors,
                    metadata={**header, "torchbridge.grad_scaler": json.dumps(zero_scale)})
    model, optimizer, scheduler, _ = target
    strict_scaler = torchbridge.amp.GradScaler("cpu", growth_interval=2)
    before = snapshot((model, optimizer, scheduler, strict_scaler))
    with pytest.raises(ValueError, match="scale"):
        checkpoint.load_training_state(tmp_path / "zero.safetensors", model, optimizer, scheduler, strict_scaler)
    assert_unchanged(before, (model, optimizer, scheduler, strict_scaler))


def test_a_scheduler_state_json_cannot_hold_is_refused_before_writing(tmp_path):
    run = make_run(1, "cpu", "StepLR")
    path = tmp_path / "run.safetensors"
    path.write_bytes(b"an earlier file")
    run[2].note = torch.ones(2)  # state_dict() holds every attribute but the optimizer
    with pytest.raises(TypeError, match=r"StepLR.state_dict\(\)\['note'\] is a Tensor"):
        checkpoint.save_training_state(path, *run)
    run[2].note = {1, 2}
    with pytest.raises(TypeError, match=r"StepLR.state_dict\(\)\['note'\] is a set"):
        checkpoint.save_training_state(path, *run)
    assert path.read_bytes() == b"an earlier file"
