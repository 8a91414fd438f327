"""torchbridge.deployment against independent references: torch.jit.load for TorchScript,
onnxruntime (run here, on other inputs than the export checked) for ONNX, and the `safetensors`
package for weights."""

import json
import os
import sys

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import torchbridge
from torchbridge.deployment import (ExportResult, ExportVerificationError, export_to_exported_program, export_to_onnx,
                                    export_to_safetensors, export_to_torchscript)

os.environ.setdefault("TORCHBRIDGE_EMU_GUARDED", "1")
torchbridge.devices.load("emu")  # for exports of a model that lives on an SDK device


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                       torch.nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1))
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class Block(torch.nn.Module):
    """Pre-norm transformer block: self-attention and a GELU feed-forward, both residual."""

    def __init__(self, width: int = 16, heads: int = 2):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.feed_forward = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                torch.nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        attended, _ = self.attention(h, h, h, need_weights=False)
        x = x + attended
        return x + self.feed_forward(self.norm2(x))


def make(kind: str):
    """A model with non-trivial weights (and batch-norm statistics), and an input for it."""
    torch.manual_seed(0)
    model, shape = {"mlp": (MLP, (3, 12)), "cnn": (CNN, (2, 3, 8, 8)), "block": (Block, (2, 5, 16))}[kind]
    model = model()
    if kind == "cnn":  # train once so running mean/var are not their initial values
        model.train()
        model(torch.randn(4, 3, 8, 8))
    return model.eval(), torch.randn(*shape)


def other_input(kind: str, batch: int):
    torch.manual_seed(batch)
    return torch.randn(*{"mlp": (batch, 12), "cnn": (batch, 3, 8, 8), "block": (batch, 5, 16)}[kind])


MODELS = ["mlp", "cnn", "block"]


@pytest.mark.parametrize("method", ["trace", "script"])
@pytest.mark.parametrize("kind", MODELS)
def test_torchscript_round_trip_is_exact(tmp_path, kind, method):
    model, x = make(kind)
    model.train()  # exported in eval mode, then put back
    result = export_to_torchscript(model, output_path=tmp_path / "m.pt", sample_input=x, method=method)
    assert model.training
    assert isinstance(result, ExportResult) and result.format == "torchscript" and result.max_abs_error == 0.0
    assert os.fspath(result) == str(tmp_path / "m.pt")
    loaded = torch.jit.load(os.fspath(result))
    model.eval()
    with torch.no_grad():
        for inp in (x, other_input(kind, x.shape[0])):
            assert torch.equal(loaded(inp), model(inp))


def test_torchscript_of_a_script_module_and_a_tuple_input(tmp_path):
    class TwoInputs(torch.nn.Module):
        def forward(self, a, b):
            return a @ b, a.sum()

    scripted = torch.jit.script(TwoInputs())
    a, b = torch.randn(2, 3), torch.randn(3, 4)
    result = export_to_torchscript(scripted, output_path=tmp_path / "s.pt", sample_input=(a, b))
    loaded = torch.jit.load(result.path)
    product, total = loaded(a, b)
    assert torch.equal(product, a @ b) and torch.equal(total, a.sum())


def test_torchscript_that_does_not_reproduce_the_model_raises_and_is_removed(tmp_path):
    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)  # a new draw on every call: the file cannot reproduce it

    with pytest.raises(ExportVerificationError, match="output 0: the TorchScript file differs from the model"):
        export_to_torchscript(Noisy(), output_path=tmp_path / "n.pt", sample_input=torch.zeros(3), method="script")
    assert not (tmp_path / "n.pt").exists()


def onnxruntime_outputs(path: str, *inputs: torch.Tensor):
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
    return session.run(None, feeds)


def assert_onnx_matches_eager_at_batch(path: str, model, kind: str, batch: int):
    """onnxruntime on a fresh input of another batch size, against PyTorch eager: an independent
    check that the exported batch axis is really dynamic."""
    other = other_input(kind, batch)
    (got,) = onnxruntime_outputs(path, other)
    with torch.no_grad():
        want = model(other).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", MODELS)
def test_onnx_matches_onnxruntime(tmp_path, kind):
    model, x = make(kind)
    result = export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x, opset_version=18,
                            input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    assert result.format == "onnx" and result.tolerance == (1e-4, 1e-5) and result.max_abs_error <= 1e-4
    file = onnx.load(result.path)
    assert [o.version for o in file.opset_import if o.domain in ("", "ai.onnx")] == [18]
    assert [i.name for i in file.graph.input] == ["x"] and [o.name for o in file.graph.output] == ["y"]
    assert_onnx_matches_eager_at_batch(result.path, model, kind, 5)


def test_onnx_opset_the_exporter_could_not_honour_is_an_error(tmp_path):
    # torch's exporter for nn.Modules writes opset 18 and later; asked for 11 it kept 18 silently.
    model, x = make("mlp")
    with pytest.raises(ExportVerificationError, match="opset_version=11 was asked for, but torch's exporter wrote opset 18"):
        export_to_onnx(model, output_path=tmp_path / "old.onnx", sample_input=x, opset_version=11)
    assert not (tmp_path / "old.onnx").exists()


def test_onnx_of_a_script_module(tmp_path):
    model, x = make("mlp")
    scripted = torch.jit.script(model)
    result = export_to_onnx(scripted, output_path=tmp_path / "s.onnx", sample_input=x)
    (got,) = onnxruntime_outputs(result.path, x)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_onnx_outside_the_tolerance_raises(tmp_path):
    model, x = make("block")
    # With no tolerance at all, onnxruntime's own attention/GELU/LayerNorm kernels must differ
    # somewhere from PyTorch's in float32.
    with pytest.raises(ExportVerificationError, match=r"output 0: onnxruntime at batch size 2 differs from the model by up to"):
        export_to_onnx(model, output_path=tmp_path / "b.onnx", sample_input=x, rtol=0.0, atol=0.0)


def graph_batch_dims(path: str):
    """Dimension 0 of every graph input and output: a name (symbolic) or a number (fixed)."""
    graph = onnx.load(path).graph
    return [v.type.tensor_type.shape.dim[0].dim_param or v.type.tensor_type.shape.dim[0].dim_value
            for v in [*graph.input, *graph.output]]


@pytest.mark.parametrize("kind", MODELS)
def test_onnx_batch_is_dynamic_by_default(tmp_path, kind):
    model, x = make(kind)
    result = export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x)
    assert result.dynamic_batch is True and result.verified_batch_sizes == (x.shape[0], x.shape[0] + 1)
    assert all(isinstance(d, str) and d for d in graph_batch_dims(result.path)), graph_batch_dims(result.path)
    # Independently of the export's own check: onnxruntime at two other batch sizes, against eager.
    for batch in (1, 7):
        assert_onnx_matches_eager_at_batch(result.path, model, kind, batch)


def test_onnx_batch_of_one_and_script_modules_are_dynamic_too(tmp_path):
    model, _ = make("mlp")
    one = export_to_onnx(model, output_path=tmp_path / "one.onnx", sample_input=other_input("mlp", 1))
    assert one.dynamic_batch and one.verified_batch_sizes == (1, 2)
    scripted = export_to_onnx(torch.jit.script(model), output_path=tmp_path / "s.onnx", sample_input=other_input("mlp", 3))
    assert scripted.dynamic_batch and scripted.verified_batch_sizes == (3, 4)
    for path in (one.path, scripted.path):
        other = other_input("mlp", 6)
        with torch.no_grad():
            np.testing.assert_allclose(onnxruntime_outputs(path, other)[0], model(other).numpy(), rtol=1e-4, atol=1e-5)


def test_onnx_static_batch_on_request(tmp_path):
    model, x = make("mlp")
    result = export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x, dynamic_batch=False)
    assert result.dynamic_batch is False and result.verified_batch_sizes == ()
    assert graph_batch_dims(result.path) == [x.shape[0], x.shape[0]]
    (got,) = onnxruntime_outputs(result.path, x)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="(?i)dimension|shape"):  # onnxruntime refuses another batch size
        onnxruntime_outputs(result.path, other_input("mlp", 5))


def test_onnx_dynamic_batch_bad_arguments(tmp_path):
    model, x = make("mlp")
    with pytest.raises(TypeError, match="dynamic_batch must be True, False or None.*got 'yes'"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x, dynamic_batch="yes")
    with pytest.raises(ValueError, match="give dynamic_axes or dynamic_batch, not both"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x, dynamic_batch=True,
                       input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    assert not any(tmp_path.iterdir()), "a rejected export must not write anything"


def test_onnx_float16_models_are_checked_at_float16s_precision(tmp_path):
    # One float16 rounding step near 0.5 is 2.4e-4; float32's default tolerance refused this file.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).half()
    x = torch.randn(8, 16, dtype=torch.half)
    result = export_to_onnx(model, output_path=tmp_path / "h.onnx", sample_input=x)
    assert result.tolerance == (4e-3, 1e-3)
    (got,) = onnxruntime_outputs(result.path, x)
    with torch.no_grad():
        np.testing.assert_allclose(got.astype(np.float32), model(x).float().numpy(), rtol=4e-3, atol=1e-3)
    with pytest.raises(ExportVerificationError, match="the rtol= and atol= arguments set it"):
        export_to_onnx(model, output_path=tmp_path / "tight.onnx", sample_input=x, rtol=0, atol=1e-9)


def test_onnx_result_says_the_batch_is_symbolic_when_dynamic_axes_made_it(tmp_path):
    model, x = make("mlp")
    named = export_to_onnx(model, output_path=tmp_path / "named.onnx", sample_input=(x,), input_names=["x"],
                           output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    assert named.dynamic_batch is True and graph_batch_dims(named.path)[0] == "batch"


class TwoInputs(torch.nn.Module):
    def forward(self, a, b):
        return a.sum() + b.sum(0)


def test_onnx_dynamic_axes_go_to_the_input_they_name(tmp_path):
    # torch's dynamic_axes conversion pairs keys with inputs in the dict's order: {"b": ...} made `a`
    # dynamic and left `b` fixed, and the check at the sample's shapes could not see it.
    a, b = torch.randn(3, 5), torch.randn(4, 6)
    for names in (["a", "b"], None):
        result = export_to_onnx(TwoInputs(), output_path=tmp_path / "two.onnx", sample_input=(a, b),
                                input_names=names, dynamic_axes={"b": {0: "n"}})
        graph = onnx.load(result.path).graph
        dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
        assert dims == {"a": [3, 5], "b": ["n", 6]}
        (got,) = onnxruntime_outputs(result.path, a, torch.randn(7, 6))  # b's first axis really is dynamic
        assert got.shape == (6,)


def test_onnx_dynamic_axes_that_name_nothing_are_refused(tmp_path):
    model, x = make("mlp")
    with pytest.raises(ValueError, match=r"dynamic_axes names 'inptu', which is neither one of the inputs \['x'\]"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x, dynamic_axes={"inptu": {0: "batch"}})
    with pytest.raises(ValueError, match=r"names 'y'.*none named: name them with output_names"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x, dynamic_axes={"y": {0: "batch"}})
    with pytest.raises(ValueError, match=r"dynamic_axes\['x'\] names axis 2, but input 'x' has 2 dimension"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x, dynamic_axes={"x": [2]})
    with pytest.raises(TypeError, match=r"dynamic_axes\['x'\] must be a list of axis numbers"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x, dynamic_axes={"x": "batch"})
    assert not any(tmp_path.iterdir()), "a rejected export must not write anything"


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x, temperature):
        return self.linear(x) / temperature


def test_onnx_samples_that_verify_nothing_or_cannot_grow_are_named(tmp_path):
    # A batch of 0: every output empty, nothing compared, yet reported verified.
    with pytest.raises(ValueError, match=r"sample_input \(\(0, 8\) float32\) gives the model Linear only empty outputs"):
        export_to_onnx(torch.nn.Linear(8, 4), output_path=tmp_path / "b0.onnx", sample_input=torch.randn(0, 8))
    # A batch of 1 beside a (1,) input: which is batched is ambiguous, and the grown sample says so.
    with pytest.raises(ValueError, match=r"sample_input grown by one row .* dynamic_batch=False"):
        export_to_onnx(Scaled(), output_path=tmp_path / "t1.onnx", sample_input=(torch.randn(1, 8), torch.tensor([2.0])))
    result = export_to_onnx(Scaled(), output_path=tmp_path / "t1.onnx", sample_input=(torch.randn(1, 8), torch.tensor([2.0])),
                            dynamic_batch=False)
    assert result.dynamic_batch is False
    for path in ("", "newdir/"):
        with pytest.raises(ValueError, match="names no file"):
            export_to_torchscript(torch.nn.Linear(8, 4), output_path=path, sample_input=torch.randn(2, 8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t1.onnx", "t1.onnx.data"]  # no stray staging


def test_a_file_name_near_the_length_limit_is_written(tmp_path):
    name = "m" * 240 + ".pt"  # 243 bytes: the staging directory beside it must not need more than 255
    result = export_to_torchscript(torch.nn.Linear(4, 4), output_path=tmp_path / name, sample_input=torch.randn(2, 4))
    assert os.path.basename(result.path) == name and os.path.isfile(result.path)
    wide = "\u00e9" * 120 + ".pt"  # 243 bytes in 123 characters
    assert os.path.isfile(export_to_torchscript(torch.nn.Linear(4, 4), output_path=tmp_path / wide,
                                                sample_input=torch.randn(2, 4)).path)
    # ONNX writes NAME.data beside NAME: 252 + 5 bytes do not fit, refused before exporting.
    with pytest.raises(ValueError, match="the file name with '.data' is 257 bytes, longer than the 255"):
        export_to_onnx(torch.nn.Linear(4, 4), output_path=tmp_path / ("o" * 247 + ".onnx"), sample_input=torch.randn(2, 4))


@pytest.mark.parametrize("kind", MODELS)
def test_safetensors_reload_is_bit_exact(tmp_path, kind):
    model, _ = make(kind)
    result = export_to_safetensors(model, output_path=tmp_path / "w.safetensors", metadata={"name": kind})
    assert result.format == "safetensors" and result.max_abs_error == 0.0 and result.tied_weights == {}
    theirs = load_file(result.path)
    state = model.state_dict()
    assert theirs.keys() == state.keys()
    for name, tensor in state.items():
        assert theirs[name].dtype == tensor.dtype and torch.equal(theirs[name], tensor), name
    with safe_open(result.path, framework="pt") as file:
        assert file.metadata() == {"format": "pt", "name": kind}


def test_safetensors_stores_tied_weights_once(tmp_path):
    class TiedLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    model = TiedLM()
    result = export_to_safetensors(model, output_path=tmp_path / "t.safetensors")
    assert result.tied_weights == {"head.weight": "embed.weight"}
    with safe_open(result.path, framework="pt") as file:
        assert list(file.keys()) == ["embed.weight"]
        assert json.loads(file.metadata()["torchbridge.tied_weights"]) == {"head.weight": "embed.weight"}
    restored = TiedLM()
    missing, unexpected = restored.load_state_dict(load_file(result.path), strict=False)
    assert missing == ["head.weight"] and unexpected == []
    assert restored.head.weight is restored.embed.weight and torch.equal(restored.head.weight, model.embed.weight)


def test_bad_arguments(tmp_path):
    model, x = make("mlp")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module or a torch.jit.ScriptModule, got OrderedDict"):
        export_to_torchscript(model.state_dict(), output_path=tmp_path / "m.pt", sample_input=x)
    with pytest.raises(ValueError, match="sample_input is required to check the exported module"):
        export_to_torchscript(model, output_path=tmp_path / "m.pt")
    with pytest.raises(ValueError, match="sample_input is required to trace the model"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx")
    with pytest.raises(TypeError, match=r"non-empty tuple of tensors, got list of \['int', 'int'\]"):
        export_to_torchscript(model, output_path=tmp_path / "m.pt", sample_input=[1, 2])
    with pytest.raises(TypeError, match="got ndarray"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=np.zeros((3, 12), np.float32))
    with pytest.raises(ValueError, match=r"sample_input \(\(3, 7\) float32\) does not fit the model MLP"):
        export_to_torchscript(model, output_path=tmp_path / "m.pt", sample_input=torch.randn(3, 7))
    with pytest.raises(ValueError, match=r"sample_input \(\(3, 7\) float32\) does not fit the model MLP"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=torch.randn(3, 7))
    with pytest.raises(ValueError, match="output_path is required"):
        export_to_safetensors(model)
    with pytest.raises(ValueError, match="directory '.*missing' does not exist"):
        export_to_safetensors(model, output_path=tmp_path / "missing" / "w.safetensors")
    with pytest.raises(ValueError, match="is a directory"):
        export_to_torchscript(model, output_path=tmp_path, sample_input=x)
    with pytest.raises(TypeError, match="output_path must be a str or os.PathLike, got int"):
        export_to_onnx(model, output_path=5, sample_input=x)
    with pytest.raises(ValueError, match="method 'compile': expected 'trace' or 'script'"):
        export_to_torchscript(model, output_path=tmp_path / "m.pt", sample_input=x, method="compile")
    with pytest.raises(TypeError, match="opset_version must be None .* or an int, got '17'"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x, opset_version="17")
    with pytest.raises(ValueError, match="rtol must be >= 0, got -1"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x, rtol=-1)
    with pytest.raises(TypeError, match="metadata must map str to str.*'epochs': 3"):
        export_to_safetensors(model, output_path=tmp_path / "w.safetensors", metadata={"epochs": 3})
    assert not any(tmp_path.iterdir()), "a rejected export must not write anything"

    class Unscriptable(torch.nn.Module):
        def forward(self, x, **options):  # TorchScript has no **kwargs
            return x

    with pytest.raises(RuntimeError, match="(?s)torch.jit.script could not compile Unscriptable: .*method='trace'"):
        export_to_torchscript(Unscriptable(), output_path=tmp_path / "u.pt", sample_input=x, method="script")


def test_missing_onnx_packages_are_named(tmp_path, monkeypatch):
    model, x = make("mlp")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` raise ImportError
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(ImportError, match="needs the packages onnxruntime, onnxscript .*pip install onnxruntime onnxscript"):
        export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x)
    # A ScriptModule goes through the TorchScript-based exporter, which does not need onnxscript.
    with pytest.raises(ImportError, match="needs the packages onnxruntime: pip install onnxruntime"):
        export_to_onnx(torch.jit.script(model), output_path=tmp_path / "m.onnx", sample_input=x)


def test_exports_of_a_model_on_an_sdk_device(tmp_path):
    model, x = make("cnn")
    model, x = model.to("emu:1"), x.to("emu:1")
    with torch.no_grad():
        want = model(x).cpu()
    weights = export_to_safetensors(model, output_path=tmp_path / "w.safetensors")
    for name, tensor in load_file(weights.path).items():
        assert torch.equal(tensor, model.state_dict()[name].cpu()), name
    onnx_file = export_to_onnx(model, output_path=tmp_path / "m.onnx", sample_input=x)  # exported from a CPU copy
    np.testing.assert_allclose(onnxruntime_outputs(onnx_file.path, x.cpu())[0], want.numpy(), rtol=1e-4, atol=1e-5)
    script = export_to_torchscript(model, output_path=tmp_path / "m.pt", sample_input=x)
    with torch.no_grad():
        assert torch.equal(torch.jit.load(script.path, map_location="cpu")(x.cpu()), want)
    assert all(p.device == torch.device("emu:1") for p in model.parameters()), "the model must stay where it was"


class ShiftsItsInputInPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(torch.nn.functional.leaky_relu(x, 0.1, inplace=True).sub_(0.5))


@pytest.mark.parametrize("export, suffix", [(export_to_torchscript, ".pt"), (export_to_exported_program, ".pt2"),
                                            (export_to_onnx, ".onnx")])
def test_a_model_that_changes_its_input_in_place_exports_and_leaves_the_sample(tmp_path, export, suffix):
    # Every run (the model's, the trace, the exported file's) got the caller's sample: each changed
    # it again, so a correct export was "ExportVerificationError: differs by up to 0.07", and the
    # caller's tensor was changed.
    sample = torch.randn(4, 8)
    before = sample.clone()
    model = ShiftsItsInputInPlace().eval()
    result = export(model, str(tmp_path / f"model{suffix}"), sample)
    assert torch.equal(sample, before)
    assert result.max_abs_error <= 1e-5
