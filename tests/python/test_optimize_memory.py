"""TorchBridgeConfig's memory option: ``activation_checkpointing`` makes UnifiedManager.optimize
run each block of the model's layer list as a checkpointed region. Checked against the same model
without it (bit-identical gradients, on cpu and emu), by counting forward calls (each block runs
twice in a training step: forward and recomputation), and against its limits (no block list,
inference, torch.compile)."""

import os

import pytest
import torch

import torchbridge
from torchbridge import TorchBridgeConfig, UnifiedManager

os.environ.setdefault("TORCHBRIDGE_EMU_GUARDED", "1")
torchbridge.devices.load("emu")  # before this process's first backward pass


class Block(torch.nn.Module):
    calls = 0

    def __init__(self):
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x):
        Block.calls += 1
        return x + self.dropout(torch.tanh(self.norm(self.linear(x))))


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.layers = torch.nn.ModuleList(Block() for _ in range(4))
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def config(backend: str, **fields) -> TorchBridgeConfig:
    return TorchBridgeConfig(backend=backend, optimization_level="O0", precision="fp32", **fields)


def step(model, device, seed=5):
    torch.manual_seed(seed)  # the dropout masks and the batch
    x = torch.randn(6, 8).to(device)
    model(x).square().sum().backward()
    return {n: p.grad.cpu() for n, p in model.named_parameters()}


@pytest.mark.parametrize("backend", ["cpu", "emu"])
def test_checkpointed_blocks_give_bit_identical_gradients_and_recompute(backend):
    torch.manual_seed(0)
    plain = Stack()
    checkpointed = Stack()
    checkpointed.load_state_dict(plain.state_dict())
    plain = UnifiedManager(config(backend)).optimize(plain)
    manager = UnifiedManager(config(backend, activation_checkpointing=True))
    checkpointed = manager.optimize(checkpointed)
    [report_step] = [s for s in manager.report().steps if s.name == "activation_checkpointing"]
    assert (report_step.outcome, report_step.detail) == ("applied", "4 blocks of 'layers' checkpointed")

    device = manager.device
    Block.calls = 0
    want = step(plain, device)
    assert Block.calls == 4
    Block.calls = 0
    got = step(checkpointed, device)
    assert Block.calls == 8  # each block once more, recomputed in backward
    for name in want:
        assert torch.equal(got[name], want[name]), name

    # Without gradients (and in eval mode) the blocks simply run once.
    Block.calls = 0
    with torch.no_grad():
        checkpointed(torch.randn(2, 8).to(device))
    checkpointed.eval()
    checkpointed(torch.randn(2, 8).to(device)).sum().backward()
    assert Block.calls == 8  # two forward passes of 4 blocks, nothing recomputed


def test_a_model_without_a_block_list_is_skipped_with_the_reason():
    manager = UnifiedManager(config("cpu", activation_checkpointing=True))
    manager.optimize(torch.nn.Linear(4, 4))
    [s] = [s for s in manager.report().steps if s.name == "activation_checkpointing"]
    assert s.outcome == "skipped" and "no nn.Sequential or nn.ModuleList of two or more blocks" in s.detail


def test_checkpointing_that_does_not_apply_leaves_compile_on():
    # It used to turn compile off although nothing was checkpointed: the plan decided before the
    # executor found no blocks.
    manager = UnifiedManager(TorchBridgeConfig(backend="cpu", optimization_level="O2", precision="fp32",
                                               activation_checkpointing=True))
    manager.optimize(torch.nn.Linear(4, 4))
    steps = {s.name: s for s in manager.report().steps}
    assert steps["activation_checkpointing"].outcome == "skipped"
    assert steps["compile"].outcome == "applied", steps["compile"].detail


def test_inference_and_compile_say_why_they_do_not_combine():
    manager = UnifiedManager(config("cpu", activation_checkpointing=True, training=False))
    manager.optimize(Stack().eval())
    [s] = [s for s in manager.report().steps if s.name == "activation_checkpointing"]
    assert (s.outcome, s.detail) == ("skipped", "inference: no backward pass, no activations kept")
    training = TorchBridgeConfig(backend="cpu", optimization_level="O2", precision="fp32", activation_checkpointing=True)
    manager = UnifiedManager(training)
    manager.optimize(Stack())
    steps = {s.name: s for s in manager.report().steps}
    assert steps["activation_checkpointing"].outcome == "applied"
    assert steps["compile"].outcome == "skipped" and "torch.compile cannot trace" in steps["compile"].detail


def test_the_field_reads_from_files_and_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    path.write_text('{"activation_checkpointing": true}')
    assert TorchBridgeConfig.from_file(path).activation_checkpointing is True
    assert TorchBridgeConfig.for_training().activation_checkpointing is False
    monkeypatch.setenv("TORCHBRIDGE_ACTIVATION_CHECKPOINTING", "on")
    assert TorchBridgeConfig().with_environment().activation_checkpointing is True
    monkeypatch.setenv("TORCHBRIDGE_ACTIVATION_CHECKPOINTING", "maybe")
    with pytest.raises(ValueError, match="TORCHBRIDGE_ACTIVATION_CHECKPOINTING"):
        TorchBridgeConfig().with_environment()


def test_checkpointed_batch_norm_updates_its_running_statistics_once():
    """The recomputation ran BatchNorm's training forward again: running statistics were updated
    twice a step (num_batches_tracked 4 after 2 steps, eval outputs 0.046 apart; found 2026-11-29).
    Blocks without parameters (an in-place ReLU, which cannot be a region of its own) run as they
    are."""
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(inplace=True),
                                   torch.nn.Linear(32, 8))

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(5))
    plain = make()
    manager = UnifiedManager(config("cpu", activation_checkpointing=True))
    checkpointed = manager.optimize(make())
    [report_step] = [s for s in manager.report().steps if s.name == "activation_checkpointing"]
    assert report_step.detail == "3 blocks of 'Sequential' checkpointed"  # not the ReLU
    for _ in range(2):
        for model in (plain, checkpointed):
            model.zero_grad()
            model(x).pow(2).sum().backward()
    for (name, want), got in zip(plain.named_parameters(), checkpointed.parameters()):
        assert torch.equal(got.grad, want.grad), name
    for name, want in plain.state_dict().items():
        assert torch.equal(checkpointed.state_dict()[name], want), name
    assert checkpointed[1].num_batches_tracked.item() == 2


def _stateful_blocks(kind):
    torch.manual_seed(0)
    if kind == "instance_norm":
        def block():
            return torch.nn.Sequential(torch.nn.Conv1d(4, 4, 3, padding=1),
                                       torch.nn.InstanceNorm1d(4, track_running_stats=True))
    else:
        def block():
            return torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(8, 8))
    return torch.nn.Sequential(block(), torch.nn.Tanh(), block())


@pytest.mark.parametrize("backend", ["cpu", "emu"])
@pytest.mark.parametrize("kind", ["instance_norm", "spectral_norm"])
def test_buffers_a_block_changes_change_once_and_are_recomputed_from_where_the_pass_started(backend, kind):
    """Only BatchNorm was protected: InstanceNorm's running statistics moved twice a step, and a
    parametrized spectral norm ran its power iteration again from the vectors the forward pass
    left, so the recomputed weight was another one: gradients 0.0064 off at the first step, 0.0165
    at the second (found 2026-11-29)."""
    plain = _stateful_blocks(kind).to(backend)
    checkpointed = UnifiedManager(config(backend, activation_checkpointing=True)).optimize(
        _stateful_blocks(kind))
    shape = (2, 4, 8) if kind == "instance_norm" else (2, 8)
    for seed in range(3):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(backend)
        for model in (plain, checkpointed):
            model.zero_grad()
            model(x).pow(2).sum().backward()
        for (name, want), got in zip(plain.named_parameters(), checkpointed.parameters()):
            assert torch.equal(got.grad.cpu(), want.grad.cpu()), (seed, name)
        for name, want in plain.state_dict().items():
            assert torch.equal(checkpointed.state_dict()[name].cpu(), want.cpu()), (seed, name)


class KeywordBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, early_stop=False, determinism_check=None):
        h = self.linear(x)
        if early_stop:
            return h
        return torch.tanh(h) if determinism_check is None else h * 0


class KeywordStack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([KeywordBlock(), KeywordBlock()])

    def forward(self, x, **options):
        for block in self.blocks:
            x = block(x, **options)
        return x


def test_a_blocks_keyword_arguments_reach_the_block_whatever_their_names():
    """They were passed to checkpoint as keywords, which took early_stop, determinism_check and
    debug as its own options: the block never saw them (found 2026-11-29)."""
    torch.manual_seed(0)
    plain = KeywordStack()
    torch.manual_seed(0)
    checkpointed = UnifiedManager(config("cpu", activation_checkpointing=True)).optimize(KeywordStack())
    x = torch.randn(2, 4)
    for options in ({}, {"early_stop": True}, {"determinism_check": "none"}):
        assert torch.equal(checkpointed(x, **options), plain(x, **options)), options
    with pytest.raises(TypeError, match="unexpected keyword argument 'debug'"):  # the block's own error
        checkpointed(x, debug=True)
