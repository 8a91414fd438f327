#!/usr/bin/env python3
"""Optimization-level benchmark (issue 14): what UnifiedManager's levels do to step time, against
O0 measured in the same run on the same weights and inputs.

  training   forward + backward + optimizer step (AdamW) at O0, O1, O2 (precision auto: the
             policy's choice here) and O2 with precision fp32 (compilation alone), on
               mlp          768 -> 3072 -> 768 (GELU), 256 tokens
               transformer  2 pre-norm encoder layers (width 256, 4 heads, GELU MLP 1024),
                            batch 8 x 64 tokens: the built-in validation transformer's shape, wider
  inference  forward under no_grad at O0 and O3 (for_inference) on the MLP with 8 tokens, where
             weights dominate (O3 on a bf16 CPU: int8 weights with bf16 activations)

Compilation happens in the warm-up steps and is reported separately. Each configuration runs in
its own process, so process-wide settings (TF32, cuDNN benchmark) and compile caches of one
cannot help or hurt another. Ratios are O0's median step time over the level's (> 1: faster).

Usage: .venv/bin/python bench/optimization_benchmark.py [--backend cpu] [--steps 20] [--warmup 3] [--json]
On a GPU machine pass --backend cuda: O0 there is fp32 with TF32 off (torch's default), so the O2
ratio is the bf16/FP8 speed-up the precision policy buys.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

CHILD = r'''
import json, statistics, sys, time, torch
from torchbridge import TorchBridgeConfig, UnifiedManager
args = json.loads(sys.argv[1])
torch.manual_seed(0)

def build(name):
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768)), (256, 768)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), (8, 64, 256)

model, shape = build(args["model"])
if args["mode"] == "inference":
    shape = (8, 768)
    model.eval()
config = TorchBridgeConfig(backend=args["backend"], optimization_level=args["level"], precision=args["precision"],
                           training=args["mode"] == "training")
manager = UnifiedManager(config)
x = torch.randn(*shape).to(manager.device)
if args["mode"] == "training":
    model, optimizer = manager.optimize(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    def step():
        optimizer.zero_grad(set_to_none=True)
        with manager.autocast():
            loss = model(x).float().square().mean()
        loss.backward()
        optimizer.step()
else:
    model = manager.optimize(model)
    def step():
        with torch.no_grad():
            model(x)

def timed():
    manager.backend.synchronize()
    start = time.perf_counter()
    step()
    manager.backend.synchronize()
    return time.perf_counter() - start

warmup = [timed() for _ in range(args["warmup"])]
times = [timed() for _ in range(args["steps"])]
print(json.dumps({"median": statistics.median(times), "first": warmup[0] if warmup else None,
                  "precision": manager.precision.precision, "applied": manager.report().applied()}))
'''

CASES = [
    ("training", "mlp", "O0", "auto"), ("training", "mlp", "O1", "auto"), ("training", "mlp", "O2", "auto"),
    ("training", "mlp", "O2", "fp32"),
    ("training", "transformer", "O0", "auto"), ("training", "transformer", "O1", "auto"),
    ("training", "transformer", "O2", "auto"), ("training", "transformer", "O2", "fp32"),
    ("inference", "mlp", "O0", "auto"), ("inference", "mlp", "O3", "auto"),
]


def run_case(backend, mode, model, level, precision, steps, warmup):
    args = dict(backend=backend, mode=mode, model=model, level=level, precision=precision, steps=steps, warmup=warmup)
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                            timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{mode} {model} {level} {precision} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1:
        parser.error(f"--steps and --warmup must be >= 1, got {args.steps} and {args.warmup}")

    started = time.time()
    rows = []
    baselines = {}
    for mode, model, level, precision in CASES:
        result = run_case(args.backend, mode, model, level, precision, args.steps, args.warmup)
        if level == "O0":
            baselines[(mode, model)] = result["median"]
        ratio = baselines[(mode, model)] / result["median"]
        rows.append(dict(mode=mode, model=model, level=level, requested=precision, **result, speedup_vs_o0=ratio))
        if not args.json:
            print(f"{mode:9} {model:11} {level} {precision:4} -> {result['precision']:4}  "
                  f"step {result['median'] * 1e3:8.2f} ms  first {result['first']:7.2f} s  "
                  f"O0/level {ratio:5.2f}x  [{', '.join(s for s in result['applied'] if s != 'place')}]", flush=True)
    machine = f"{platform.machine()}, {os.cpu_count()} logical CPUs, {platform.platform()}"
    if args.json:
        print(json.dumps({"backend": args.backend, "machine": machine, "rows": rows}, indent=2))
    else:
        print(f"backend {args.backend}; {machine}; {args.steps} timed steps after {args.warmup} warm-up; "
              f"{time.time() - started:.0f} s in all")


if __name__ == "__main__":
    main()
