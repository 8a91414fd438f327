#!/usr/bin/env python3
"""GradScaler overhead (issue 14): what loss scaling adds around one optimizer step (scale +
unscale_ + step + update), on a model of 100 parameter tensors, for

  C++      torchbridge::amp::GradScaler with torch::optim::SGD (build/bin/grad_scaler_benchmark)
  Python   torch.amp.GradScaler with torch.optim.SGD (the baseline)
  binding  torchbridge.amp.GradScaler with torch.optim.SGD (the C++ scaler driven from Python)

all measured in this one run, on the CPU, one thread. Overhead = median time per iteration with
the scaler minus without it (the optimizer step alone), so the step's own cost cancels out. The
ratio printed is C++ overhead / Python overhead (target <= 1).

Usage: .venv/bin/python bench/grad_scaler_benchmark.py [--tensors 100] [--size 1024] [--iterations 200]
                                                       [--repeats 7] [--binary build/bin/grad_scaler_benchmark]
"""

import argparse
import json
import os
import statistics
import subprocess
import time

import torch

import torchbridge.amp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def median_seconds(repeats: int, body) -> float:
    body()  # warm-up, as bench/median_seconds.h
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        body()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def python_overhead_us(make_scaler, tensors: int, size: int, iterations: int, repeats: int) -> "tuple[float, float]":
    torch.manual_seed(0)
    params = []
    for _ in range(tensors):
        param = torch.randn(size, requires_grad=True)
        param.grad = torch.randn(size)
        params.append(param)
    # foreach=False: torch::optim::SGD steps tensor by tensor, so both sides do the same step.
    optimizer = torch.optim.SGD(params, lr=1e-6, foreach=False)
    scaler = make_scaler()
    loss = torch.randn(())

    def plain():
        for _ in range(iterations):
            optimizer.step()

    def scaled():
        for _ in range(iterations):
            scaler.scale(loss)
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()

    plain_s = median_seconds(repeats, plain)
    scaled_s = median_seconds(repeats, scaled)
    return plain_s / iterations * 1e6, (scaled_s - plain_s) / iterations * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=100)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "grad_scaler_benchmark"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = dict(init_scale=1.0, growth_interval=1_000_000_000)

    out = subprocess.run([args.binary, str(args.tensors), str(args.size), str(args.iterations), str(args.repeats)],
                         check=True, capture_output=True, text=True).stdout
    cpp = json.loads(out)
    py_plain, py_overhead = python_overhead_us(lambda: torch.amp.GradScaler("cpu", **options), args.tensors,
                                               args.size, args.iterations, args.repeats)
    tb_plain, tb_overhead = python_overhead_us(lambda: torchbridge.amp.GradScaler("cpu", **options), args.tensors,
                                               args.size, args.iterations, args.repeats)
    print(f"model: {args.tensors} parameter tensors x {args.size} float32, SGD, CPU, 1 thread; "
          f"median of {args.repeats} x {args.iterations} iterations")
    print(f"{'':34}{'step alone':>12}{'scaler overhead':>18}")
    print(f"{'C++ torchbridge::amp::GradScaler':34}{cpp['plain_step_us']:>10.1f}us{cpp['overhead_us']:>16.1f}us")
    print(f"{'Python torch.amp.GradScaler':34}{py_plain:>10.1f}us{py_overhead:>16.1f}us")
    print(f"{'Python torchbridge.amp.GradScaler':34}{tb_plain:>10.1f}us{tb_overhead:>16.1f}us")
    print(f"C++ overhead / Python torch.amp overhead: {cpp['overhead_us'] / py_overhead:.2f}x (target <= 1)")
    print(f"torchbridge.amp / torch.amp overhead (both from Python): {tb_overhead / py_overhead:.2f}x")


if __name__ == "__main__":
    main()
