"""torchbridge.memory.checkpoint against torch.utils.checkpoint (use_reentrant=False) and against no
checkpointing, from Python, on a stack of nn.TransformerEncoderLayer blocks, each block but the last
checkpointed; on accelerators also torchbridge.memory.offload_activations around the whole forward
pass. One training step = forward + backward, median of REPEATS, all in one run:

    step time ratio        against no checkpointing, for torch's checkpoint and ours
    ours / torch's         step time of ours against torch's (goal: <= 1.0x, i.e. no slower)
    peak activation memory (SDK devices: the caching allocator's peak during the step minus what was
                           allocated before it and minus the gradients), against no checkpointing

    .venv/bin/python bench/activation_checkpoint_benchmark.py [--device cpu|emu] [--layers 12] [--repeats 5]
"""

import argparse
import json
import statistics
import time

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

import torchbridge
from torchbridge.memory import checkpoint as our_checkpoint
from torchbridge.memory import offload_activations


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    backend = None
    if args.device != "cpu":
        backend = torchbridge.BackendFactory.create(args.device)
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.TransformerEncoderLayer(args.d_model, 4, 4 * args.d_model, dropout=0.1)
                           for _ in range(args.layers)).to(args.device).train()
    x = torch.randn(args.seq, args.batch, args.d_model, device=args.device)
    gradient_bytes = sum(p.numel() * p.element_size() for p in blocks.parameters())

    def forward(wrap):
        if wrap == "offload":
            with offload_activations():
                return forward(None)
        h = x
        for i, block in enumerate(blocks):
            h = wrap(block, h) if wrap is not None and i + 1 < len(blocks) else block(h)
        return h

    def step(wrap):
        blocks.zero_grad(set_to_none=True)
        forward(wrap).pow(2).mean().backward()
        if backend is not None:
            backend.synchronize()

    def measure(wrap):
        step(wrap)  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            step(wrap)
            times.append(time.perf_counter() - start)
        result = {"step_ms": 1e3 * statistics.median(times)}
        if backend is not None:
            blocks.zero_grad(set_to_none=True)
            before = backend.get_memory_stats()["allocated_bytes"]
            backend.reset_peak_memory_stats()
            step(wrap)
            peak = backend.get_memory_stats()["peak_allocated_bytes"]
            result["activation_peak_mib"] = (peak - before - gradient_bytes) / 2**20
        return result

    modes = {
        "none": None,
        "torch.utils.checkpoint": lambda block, h: torch_checkpoint.checkpoint(block, h, use_reentrant=False),
        "torchbridge.memory.checkpoint": lambda block, h: our_checkpoint(block, h, use_reentrant=False),
    }
    if args.device != "cpu":  # on the CPU there is nothing to offload to
        modes["torchbridge.memory.offload_activations"] = "offload"
    results = {name: measure(wrap) for name, wrap in modes.items()}
    none = results["none"]
    for name, r in results.items():
        r["step_time_ratio"] = round(r["step_ms"] / none["step_ms"], 3)
        r["step_ms"] = round(r["step_ms"], 2)
        if "activation_peak_mib" in r:
            r["activation_peak_ratio"] = round(r["activation_peak_mib"] / none["activation_peak_mib"], 3)
            r["activation_peak_mib"] = round(r["activation_peak_mib"], 1)
        print(json.dumps({"device": args.device, "layers": args.layers, "mode": name, **r}))
    ours, theirs = results["torchbridge.memory.checkpoint"], results["torch.utils.checkpoint"]
    print(json.dumps({"ours_over_torchs_step_time": round(ours["step_ms"] / theirs["step_ms"], 3)}))


if __name__ == "__main__":
    main()
