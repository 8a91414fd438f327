"""TorchBridgeConfig's memory option: ``activation_checkpointing`` makes UnifiedManager.optimize
run each block of the model's layer list as a checkpointed region. Checked against the same model
without it (bit-identical gradients, on cpu and emu), by counting forward calls (each block runs
twice in a training step: forward and recomputation), and against its limits (no block list,
inference, torch.compile)."""

import os
import warnings

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


def _hugging_face_decoder(kind, attention):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "llama":
        settings = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                            max_position_embeddings=64)
        settings._attn_implementation = attention
        return transformers.LlamaForCausalLM(settings).train()
    settings = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=64,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    settings._attn_implementation = attention
    return transformers.GPT2LMHeadModel(settings).train()


def _language_model_step(model, **call):
    torch.manual_seed(1)
    ids = torch.randint(0, 100, (2, 16))
    model(input_ids=ids, labels=ids, **call).loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


# GPT-2's eager attention is left out: recomputed, it rounds differently (1.8e-7), torch's checkpoint too.
@pytest.mark.parametrize("kind, attention", [("llama", "sdpa"), ("llama", "eager"), ("gpt2", "sdpa")])
def test_hugging_face_decoders_called_as_usual_get_the_gradients_of_no_checkpointing(kind, attention):
    """Called normally, a Hugging Face decoder's config has use_cache=True: each layer appended its
    keys and values to the cache in its forward pass and attended over them twice when recomputed.
    22 of 30 gradients of a small Llama were wrong, silently (sdpa), eager attention failed with a
    size mismatch, GPT-2's gradients were wrong too. As Hugging Face's own gradient checkpointing
    does, the configuration's turns use_cache off; a cache passed anyway is refused."""
    plain = _hugging_face_decoder(kind, attention)
    model = _hugging_face_decoder(kind, attention)
    assert model.config.use_cache is True
    manager = UnifiedManager(config("cpu", activation_checkpointing=True))
    model = manager.optimize(model)
    want, got = _language_model_step(plain), _language_model_step(model)
    wrong = [name for name in want if not torch.equal(got[name], want[name])]
    assert not wrong, f"{len(wrong)} of {len(want)} gradients differ, e.g. {wrong[0]}"
    [report_step] = [s for s in manager.report().steps if s.name == "activation_checkpointing"]
    assert report_step.detail.startswith("2 blocks of ") and "use_cache turned off in the model's config" in \
        report_step.detail
    assert model.config.use_cache is False

    model.zero_grad()
    with pytest.raises(ValueError, match=r"was given a DynamicCache, a key/value cache its forward pass fills; .*"
                                         r"Call the model with use_cache=False while training"):
        _language_model_step(model, use_cache=True)
    with torch.no_grad():  # nothing is recomputed: the cache is the caller's to use
        assert model(input_ids=torch.randint(0, 100, (1, 4)), use_cache=True).past_key_values is not None


def test_a_model_compiled_after_optimize_gets_the_gradients_of_the_uncompiled_one():
    """torch.compile(model) after the configuration's checkpointing failed in the forward pass with
    the region's internal "needs a detached alias" (dynamo traced into the region)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    plain, checkpointed = Stack(), Stack()
    checkpointed.load_state_dict(plain.state_dict())
    compiled = torch.compile(UnifiedManager(config("cpu", activation_checkpointing=True)).optimize(checkpointed),
                             backend="eager")
    want = step(plain, "cpu")
    Block.calls = 0
    step(compiled, "cpu")
    assert Block.calls == 8  # the regions ran, and were recomputed
    for name, parameter in checkpointed.named_parameters():
        assert torch.equal(parameter.grad, want[name]), name
    torch._dynamo.reset()


class SharedBlockStack(Stack):
    """ALBERT's weight sharing: one block object listed four times."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block()] * 4)


def test_a_block_listed_several_times_is_one_region_per_call():
    """A block listed 4 times was wrapped 4 times: its calls nested 4 regions, it ran 20 times a
    step instead of 8, and the report said 4 blocks."""
    torch.manual_seed(0)
    plain, checkpointed = SharedBlockStack(), SharedBlockStack()
    checkpointed.load_state_dict(plain.state_dict())
    manager = UnifiedManager(config("cpu", activation_checkpointing=True))
    checkpointed = manager.optimize(checkpointed)
    want = step(plain, "cpu")
    Block.calls = 0
    got = step(checkpointed, "cpu")
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert Block.calls == 8  # 4 calls, each recomputed once
    [report_step] = [s for s in manager.report().steps if s.name == "activation_checkpointing"]
    assert report_step.detail == "1 block of 'layers' checkpointed (listed 4 times: each call is a region of its own)"


@pytest.mark.parametrize("embedding_trains", [True, False])
def test_frozen_lower_blocks_are_regions_only_when_backward_reaches_them(embedding_trains):
    """Fine-tuning the top layers: the frozen blocks' regions warned "Checkpoint regions that train,
    or run this one under torch.no_grad()", about regions the user never chose, and the report
    counted them as checkpointed. A frozen block whose input requires grad (a trained embedding
    below it) still keeps activations for backward, so it stays a region."""
    torch.manual_seed(0)
    plain, checkpointed = Stack(), Stack()
    checkpointed.load_state_dict(plain.state_dict())
    for model in (plain, checkpointed):
        for block in model.layers[:2]:
            block.requires_grad_(False)
        model.embed.requires_grad_(embedding_trains)
    manager = UnifiedManager(config("cpu", activation_checkpointing=True))
    checkpointed = manager.optimize(checkpointed)

    def trained_step(model):
        torch.manual_seed(5)
        model(torch.randn(6, 8)).square().sum().backward()
        return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    want = trained_step(plain)
    Block.calls = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = trained_step(checkpointed)
    assert Block.calls == (8 if embedding_trains else 6)  # frozen blocks below frozen layers: not recomputed
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert all(p.grad is None for p in checkpointed.layers[:2].parameters())
    [report_step] = [s for s in manager.report().steps if s.name == "activation_checkpointing"]
    assert report_step.detail == ("4 blocks of 'layers' checkpointed; 2 of them train no parameter, so a call of one "
                                  "is checkpointed only when an input requires grad (otherwise backward never "
                                  "reaches it and it runs as it is)")
