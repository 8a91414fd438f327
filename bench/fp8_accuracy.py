#!/usr/bin/env python3
"""FP8 training accuracy against BF16 (issue 14, section 3), on the built-in transformer.

The built-in validation transformer (``torchbridge validate --model builtin:transformer``: a
pre-norm block with 4-head self-attention and a GELU MLP, width 64, 32 features in and out) is a
TorchScript module, whose layers cannot be swapped. This program rebuilds it as an ``nn.Module``
with the same parameter names, loads the built-in weights, and first checks that the two give the
same outputs. Then it trains three copies on the same regression task (match a second built-in
transformer, seed 1, on random inputs drawn with --seed), with AdamW and the same batches:

  float32  no autocast: the reference for bf16
  bf16     torch.autocast(bfloat16) around forward, float32 master weights
  fp8      the same, after torchbridge.fp8.convert_to_fp8 (every Linear: e4m3 forward, e5m2
           gradients, delayed scaling), which the autocast leaves to the FP8 layers

and reports the mean loss of the last 10 steps of each, bf16's against float32's and fp8's
against bf16's (signed, relative), and the share of BF16's loss reduction FP8 achieves.
Acceptance: fp8's gap to bf16 is within --tolerance (default 15%; e4m3 keeps 3 mantissa bits,
and at width 64 its rounding noise sets a loss floor about 10-14% above BF16's, while BF16 itself
is within 1% of float32). Exit status 1 when it is not.

Usage: .venv/bin/python bench/fp8_accuracy.py [--device cpu|emu|cuda] [--steps 200] [--seed 0] [--json]
"""

import argparse
import json
import math
import sys

import torch
from torch import nn

import torchbridge
from torchbridge.fp8 import convert_to_fp8, matmul_kernel
from torchbridge.validation import builtin_model

WIDTH, HEADS, FEATURES = 64, 4, 32


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        batch, tokens, width = x.shape
        q, k, v = (t.reshape(batch, tokens, HEADS, width // HEADS).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(width // HEADS))
        y = torch.matmul(torch.softmax(scores, -1), v)
        return self.proj(y.transpose(1, 2).reshape(batch, tokens, width))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, 2 * WIDTH)
        self.fc2 = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class BuiltinTransformer(nn.Module):
    """builtin:transformer as an nn.Module (src/validation/builtin_models.cpp)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(FEATURES, WIDTH)
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attention = SelfAttention()
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = FeedForward()
        self.norm3 = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, FEATURES)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.attention(self.norm1(h))
        h = h + self.mlp(self.norm2(h))
        return self.head(self.norm3(h))


def builtin_transformer(seed: int) -> BuiltinTransformer:
    scripted = builtin_model("transformer", seed=seed)
    model = BuiltinTransformer()
    model.load_state_dict(scripted.state_dict())
    probe = torch.randn(2, 8, FEATURES)
    with torch.no_grad():
        difference = (model(probe) - scripted(probe)).abs().max().item()
    if difference > 1e-5:
        raise RuntimeError(f"the nn.Module rebuild differs from builtin:transformer by {difference}")
    return model


def train(model, device, steps, batches, teacher_outputs, lr, autocast):
    """AdamW steps over the batches in turn, under bf16 autocast when ``autocast``; the losses."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        inputs, targets = batches[step % len(batches)], teacher_outputs[step % len(batches)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.mse_loss(model(inputs).float(), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, emu, cuda, ... (default cpu)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batches", type=int, default=8, help="distinct batches cycled through")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--tolerance", type=float, default=0.15, help="largest accepted relative loss gap")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    if args.device.split(":")[0] not in ("cpu", "cuda", "mps", "xpu"):
        torchbridge.devices.load(args.device.split(":")[0])
    device = torch.device(args.device)
    # The models' weights are the built-in ones (their own seeds 0 and 1); --seed draws the inputs,
    # and the rebuild checks' probes, which come first.
    torch.manual_seed(args.seed)
    teacher = builtin_transformer(seed=1)
    batches = [torch.randn(8, 64, FEATURES) for _ in range(args.batches)]
    with torch.no_grad():
        teacher_outputs = [teacher(b).to(device) for b in batches]
    batches = [b.to(device) for b in batches]

    student = builtin_transformer(seed=0)
    float32_model, bf16_model, fp8_model = (BuiltinTransformer().to(device) for _ in range(3))
    for model in (float32_model, bf16_model, fp8_model):
        model.load_state_dict(student.state_dict())
    report = convert_to_fp8(fp8_model)

    def final_loss(losses):
        return sum(losses[-10:]) / 10

    float32_losses = train(float32_model, device, args.steps, batches, teacher_outputs, args.lr, autocast=False)
    bf16_losses = train(bf16_model, device, args.steps, batches, teacher_outputs, args.lr, autocast=True)
    fp8_losses = train(fp8_model, device, args.steps, batches, teacher_outputs, args.lr, autocast=True)
    float32_final, bf16_final, fp8_final = map(final_loss, (float32_losses, bf16_losses, fp8_losses))
    gap = abs(fp8_final - bf16_final) / bf16_final
    reduction_retained = (bf16_losses[0] - fp8_final) / (bf16_losses[0] - bf16_final)
    result = {
        "device": str(device),
        "fp8_matmul": matmul_kernel(device),
        "steps": args.steps,
        "seed": args.seed,
        "torch": torch.__version__,
        "converted_layers": len(report.converted),
        "initial_loss": bf16_losses[0],
        "float32_final_loss": float32_final,
        "bf16_final_loss": bf16_final,
        "fp8_final_loss": fp8_final,
        "bf16_vs_float32": (bf16_final - float32_final) / float32_final,
        "fp8_vs_bf16": (fp8_final - bf16_final) / bf16_final,
        "relative_gap": gap,
        "reduction_retained": reduction_retained,
        "tolerance": args.tolerance,
        "within_tolerance": gap <= args.tolerance,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(report.summary())
        print(f"device {result['device']} (fp8 matmul: {result['fp8_matmul']}), {args.steps} AdamW steps, "
              f"input seed {args.seed}, torch {torch.__version__}")
        print(f"loss at step 0             {bf16_losses[0]:.5f}")
        print(f"float32, mean of last 10   {float32_final:.5f}")
        print(f"bf16,    mean of last 10   {bf16_final:.5f} ({result['bf16_vs_float32']:+.1%} vs float32)")
        print(f"fp8,     mean of last 10   {fp8_final:.5f} ({result['fp8_vs_bf16']:+.1%} vs bf16)")
        print(f"relative gap fp8 vs bf16   {gap:.2%} (tolerance {args.tolerance:.0%})")
        print(f"loss reduction retained    {reduction_retained:.2%} of bf16's")
    return 0 if result["within_tolerance"] else 1


if __name__ == "__main__":
    sys.exit(main())
