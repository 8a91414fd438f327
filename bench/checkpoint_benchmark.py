#!/usr/bin/env python3
"""Checkpoint benchmark (issue 5): TorchBridge's safetensors reader and writer against Python's
safetensors, torch.load, memcpy and a plain sequential write, all measured in this one run on a
checkpoint shaped like a transformer (fp32 embeddings, norms and biases; bf16 attention and MLP
matrices; an untied output head).

  load to the CPU  torchbridge.checkpoint.load vs safetensors.torch.load_file (same file) vs
                   torch.load (same state dict saved with torch.save), warm and cold page cache.
                   Every loader is timed for load + one copy of every tensor into a preallocated
                   state dict (what load_state_dict does), because our reader only maps the file:
                   its data is read when touched, so timing the load call alone would flatter it.
  load to emu      the C++ reader (build/bin/checkpoint_device_load) vs one memcpy of as many bytes
  load to a GPU    with --device cuda: the C++ reader straight to the GPU vs
                   safetensors.torch.load_file(device="cuda") and vs the host path measured in the
                   same run: one memcpy of the file's bytes out of its mapping plus one
                   host-to-device copy of as many bytes from pinned memory
  save             torchbridge.checkpoint.save vs writing the same bytes sequentially; both fsync
  peak memory      anonymous memory each loader adds at its peak (sampled every millisecond from
                   outside the loading process) vs the largest tensor

Usage: .venv/bin/python bench/checkpoint_benchmark.py [--size-mib 1024] [--repeats 5] [--dir DIR] [--keep]
                                                      [--device-load build/bin/checkpoint_device_load]
                                                      [--device emu|cuda]
It needs about 2.2 x size of free disk in DIR (default: a new directory in /tmp), removed at the end.
"""

import argparse
import ctypes
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import safetensors
import safetensors.torch
import torch

import torchbridge
import torchbridge.checkpoint as tbc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE_LOAD = os.path.join(REPO, "build", "bin", "checkpoint_device_load")
MiB = 2 ** 20


# ---- the workload ---------------------------------------------------------------------------------

def transformer_shapes(size_mib):
    """(name, shape, dtype) of a GPT-style model of about `size_mib` MiB, in state-dict order."""
    d, vocab, positions = (1024, 32000, 2048) if size_mib >= 256 else (256, 4000, 256)
    f32, bf16 = torch.float32, torch.bfloat16
    fixed = (2 * vocab * d + positions * d + 2 * d) * 4
    per_layer = 12 * d * d * 2 + 13 * d * 4  # bf16 matrices; fp32 norms (4d) and biases (9d)
    layers = max(1, (size_mib * MiB - fixed) // per_layer)
    shapes = [("embed.weight", (vocab, d), f32), ("pos.weight", (positions, d), f32)]
    for i in range(layers):
        p = f"layers.{i}."
        shapes += [(p + "ln1.weight", (d,), f32), (p + "ln1.bias", (d,), f32),
                   (p + "attn.qkv.weight", (3 * d, d), bf16), (p + "attn.qkv.bias", (3 * d,), f32),
                   (p + "attn.out.weight", (d, d), bf16), (p + "attn.out.bias", (d,), f32),
                   (p + "ln2.weight", (d,), f32), (p + "ln2.bias", (d,), f32),
                   (p + "mlp.up.weight", (4 * d, d), bf16), (p + "mlp.up.bias", (4 * d,), f32),
                   (p + "mlp.down.weight", (d, 4 * d), bf16), (p + "mlp.down.bias", (d,), f32)]
    shapes += [("norm.weight", (d,), f32), ("norm.bias", (d,), f32), ("lm_head.weight", (vocab, d), f32)]
    return shapes


def transformer_state(size_mib):
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=generator).to(dtype) for name, shape, dtype in transformer_shapes(size_mib)}


def destination(size_mib):
    """A preallocated, touched state dict to copy loads into (as load_state_dict does)."""
    return {name: torch.zeros(shape, dtype=dtype) for name, shape, dtype in transformer_shapes(size_mib)}


# ---- page cache control ---------------------------------------------------------------------------

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def evict(path):
    """Drops the file's clean pages from the page cache; no root needed. Mappings of the file
    must be gone (they pin their pages), so loaded tensors are released before this."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_fraction(path):
    """Fraction of the file's pages in the page cache (mincore), to verify evict()."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        pages = (size + 4095) // 4096
        vector = (ctypes.c_ubyte * pages)()
        try:
            if libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            libc.munmap(address, size)
        return 1 - bytes(vector).count(0) / pages
    finally:
        os.close(fd)


# ---- timing helpers -------------------------------------------------------------------------------

def median(values):
    return statistics.median(values)


def timed(body, repeats, before=None):
    """Median seconds of body() over `repeats` runs after one warm-up; before() runs untimed first."""
    body()
    samples = []
    for _ in range(repeats):
        if before:
            before()
        start = time.perf_counter()
        body()
        samples.append(time.perf_counter() - start)
    return median(samples)


def fsync_write(path, tensors):
    """The save baseline: the tensors' bytes written in order to a new file, then fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for tensor in tensors:
            view = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
            while len(view):
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path, buffer):
    """Seconds to copy the whole file out of a fresh read-only mapping into `buffer`: what reading
    the bytes costs, with no format around them."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        start = time.perf_counter()
        address = libc.mmap(None, size, 1, 2, fd, 0)  # PROT_READ, MAP_PRIVATE
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        ctypes.memmove(buffer.data_ptr(), address, size)
        libc.munmap(address, size)
        return time.perf_counter() - start
    finally:
        os.close(fd)


def loaders(st_path, pt_path):
    return {
        "torchbridge": (st_path, lambda: tbc.load(st_path)),
        "safetensors": (st_path, lambda: safetensors.torch.load_file(st_path)),
        "torch.load": (pt_path, lambda: torch.load(pt_path, map_location="cpu", weights_only=True)),
        "torch.load(mmap=True)": (pt_path, lambda: torch.load(pt_path, mmap=True, weights_only=True)),
    }


def load_and_copy(load, dest):
    """Seconds for the load call alone and for load + copying every tensor into `dest`."""
    start = time.perf_counter()
    state = load()
    loaded = time.perf_counter()
    for name, tensor in state.items():
        dest[name].copy_(tensor)
    done = time.perf_counter()
    del state
    gc.collect()
    return loaded - start, done - start


# ---- peak memory, sampled from outside the loading process -----------------------------------------

def rss_kib(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem"):
                fields[key] = int(value.split()[0])
    return fields


def sample_peak(command, env=None):
    """Runs a child that prints "ready", loads on a line from stdin, prints "done" and exits on the
    next line. Returns (peak, retained) growth of its anonymous memory in bytes: the highest
    RssAnon between "go" and "done" (sampled every ~1 ms) and the RssAnon at "done", both minus
    the RssAnon at "ready"."""
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{command[0]} did not start")
        base = rss_kib(child.pid)["RssAnon"]
        finished = threading.Event()
        threading.Thread(target=lambda: (child.stdout.readline(), finished.set()), daemon=True).start()
        peak = base
        child.stdin.write("go\n")
        child.stdin.flush()
        while not finished.is_set():
            peak = max(peak, rss_kib(child.pid)["RssAnon"])
            time.sleep(0.001)
        retained = rss_kib(child.pid)["RssAnon"]
        peak = max(peak, retained)
        child.stdin.write("exit\n")
        child.stdin.flush()
        child.wait(timeout=60)
        return (peak - base) * 1024, (retained - base) * 1024
    finally:
        if child.poll() is None:
            child.kill()


def child_main(loader_name, size_mib, st_path, pt_path):
    dest = destination(size_mib)
    load = loaders(st_path, pt_path)[loader_name][1]
    print("ready", flush=True)
    sys.stdin.readline()
    state = load()
    for name, tensor in state.items():
        dest[name].copy_(tensor)
    print("done", flush=True)
    sys.stdin.readline()


# ---- the run ---------------------------------------------------------------------------------------

def machine():
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    memory = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    return (f"{model}, {os.cpu_count()} cores, {memory / 2**20:.0f} GiB, Linux {platform.release()}; "
            f"torch {torch.__version__}, safetensors {safetensors.__version__}, {torch.get_num_threads()} intra-op thread(s)")


def line(label, value, note=""):
    print(f"  {label:<46} {value:<24} {note}")


def goal(text, met):
    return f"goal {text}: {'met' if met else 'NOT met'}"


def main():
    # One intra-op thread for every loader's copies (as sdk_benchmark does): the results then do
    # not depend on whether the machine's other core is free.
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the checkpoint files go (default: a new /tmp directory)")
    parser.add_argument("--keep", action="store_true", help="keep the files")
    parser.add_argument("--device-load", default=DEVICE_LOAD, help="the checkpoint_device_load program")
    parser.add_argument("--device", default="emu", help="where device loads go: emu (default) or cuda")
    parser.add_argument("--child", nargs=4, metavar=("LOADER", "SIZE_MIB", "ST", "PT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_main(args.child[0], int(args.child[1]), args.child[2], args.child[3])

    directory = tempfile.mkdtemp(prefix="tb-ckpt-bench-", dir=args.dir)
    try:
        run(args, directory)
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


def run(args, directory):
    repeats = max(1, args.repeats)
    state = transformer_state(args.size_mib)
    total = sum(t.nbytes for t in state.values())
    largest_name, largest = max(((n, t.nbytes) for n, t in state.items()), key=lambda item: item[1])
    free = shutil.disk_usage(directory).free
    if free < 2.2 * total:
        sys.exit(f"checkpoint_benchmark: {directory} has {free / MiB:.0f} MiB free; {2.2 * total / MiB:.0f} MiB needed")
    st_path, pt_path, baseline_path = (os.path.join(directory, name)
                                       for name in ("model.safetensors", "model.pt", "baseline.bin"))

    print("TorchBridge checkpoint benchmark")
    print(f"  machine: {machine()}")
    print(f"  checkpoint: {total / MiB:.0f} MiB, {len(state)} tensors (fp32 embeddings, norms, biases; bf16 "
          f"matrices), largest {largest_name} {largest / MiB:.0f} MiB; medians of {repeats} runs\n")

    # -- save ------------------------------------------------------------------------------------
    ours, plain = [], []
    for rep in range(repeats):
        order = [("ours", st_path), ("plain", baseline_path)]
        for which, path in order if rep % 2 == 0 else order[::-1]:  # alternate who goes first
            for stale in (st_path, baseline_path):
                if os.path.exists(stale):
                    os.remove(stale)
            os.sync()  # start from a clean page cache for both
            start = time.perf_counter()
            if which == "ours":
                tbc.save(path, state)
            else:
                fsync_write(path, state.values())
            (ours if which == "ours" else plain).append(time.perf_counter() - start)
    for leftover in (st_path, baseline_path):
        if os.path.exists(leftover):
            os.remove(leftover)
    tbc.save(st_path, state)
    torch.save(state, pt_path)
    with open(pt_path, "rb") as f:
        os.fsync(f.fileno())  # clean pages can be evicted for the cold runs
    save_ratio = median(plain) / median(ours)
    print("Save (fsync'ed), bandwidth:")
    line("torchbridge.checkpoint.save", f"{median(ours):.3f} s  {total / median(ours) / 1e9:.2f} GB/s")
    line("sequential write of the same bytes", f"{median(plain):.3f} s  {total / median(plain) / 1e9:.2f} GB/s")
    line("ratio (ours / baseline bandwidth)", f"{save_ratio:.2f}x", goal(">= 0.8x", save_ratio >= 0.8))

    # -- load to the CPU ---------------------------------------------------------------------------
    del state
    gc.collect()
    dest = destination(args.size_mib)
    candidates = loaders(st_path, pt_path)
    results = {}
    worst_residency = 0.0
    # Page-aligned like the mapping: on this CPU a copy whose destination sits a few bytes past the
    # source's offset within a page runs ~4x slower (4K aliasing), which would misstate the ceiling.
    raw = torch.zeros(os.path.getsize(st_path) + 4096, dtype=torch.uint8)
    raw = raw[(-raw.data_ptr()) % 4096:]
    for cache in ("warm", "cold"):
        times = {name: ([], []) for name in candidates}
        raw_read = []
        # An untimed round first: warms the page cache (warm), or brings the kernel's free memory
        # into the state repeated cold reads leave it in (cold; the first cold read after other
        # work varies by 3x on the development VM).
        for rep in range(-1, repeats):
            names = list(candidates)
            names = names[rep % len(names):] + names[:rep % len(names)]  # rotate who goes first
            for name in names:
                path, load = candidates[name]
                if cache == "cold":
                    evict(st_path)
                    evict(pt_path)
                    worst_residency = max(worst_residency, resident_fraction(path))
                load_only, with_copy = load_and_copy(load, dest)
                if rep >= 0:
                    times[name][0].append(load_only)
                    times[name][1].append(with_copy)
            if cache == "cold":
                evict(st_path)
            if rep >= 0:
                raw_read.append(read_file(st_path, raw))
        results[cache] = {name: (median(a), median(b)) for name, (a, b) in times.items()}
        results[cache]["raw"] = (0, median(raw_read))
    del raw
    print(f"\nLoad to the CPU: load + copy of every tensor into a preallocated state dict "
          f"(cold: both files evicted from the page cache before each load; at most {worst_residency:.1%} of a "
          f"file was still resident after eviction, checked with mincore):")
    print(f"  {'':<46} {'warm':<24} cold")
    for name in candidates:
        warm, cold = results["warm"][name][1], results["cold"][name][1]
        line(name, f"{warm:.3f} s ({total / warm / 1e9:.2f} GB/s)", f"{cold:.3f} s ({total / cold / 1e9:.2f} GB/s)")
    goals_met = True
    for other, wanted in (("safetensors", 1.0), ("torch.load", 3.0)):
        for cache in ("warm", "cold"):
            ratio = results[cache][other][1] / results[cache]["torchbridge"][1]
            goals_met &= ratio >= wanted
            line(f"torchbridge speed / {other}, {cache}", f"{ratio:.2f}x", goal(f">= {wanted:g}x", ratio >= wanted))
    line("(information) reading the file's bytes", f"{results['warm']['raw'][1]:.3f} s",
         f"{results['cold']['raw'][1]:.3f} s: the safetensors file mapped and copied into one buffer, no parsing")
    print("  (information) the load call alone, warm: " + ", ".join(
        f"{name} {results['warm'][name][0]:.3f} s" for name in candidates) + "; ours only maps the file")

    # -- load to a device ----------------------------------------------------------------------------
    del dest
    gc.collect()
    env = dict(os.environ, TORCHBRIDGE_EMU_MEMORY=f"{2 * total // MiB + 256}MiB")
    if not os.path.exists(args.device_load):
        print(f"\nLoad to {args.device}: skipped, {args.device_load} is not built")
    elif args.device == "emu":
        load_to_emu(args, st_path, total, repeats, env)
    else:
        load_to_gpu(args, st_path, total, repeats)

    # -- peak memory -------------------------------------------------------------------------------
    print(f"\nPeak extra anonymous memory while loading (sampled every ~1 ms from outside; largest tensor "
          f"{largest / MiB:.0f} MiB):")
    me = [sys.executable, os.path.abspath(__file__), "--child"]
    runs = [(name, me + [name, str(args.size_mib), st_path, pt_path], None)
            for name in ("torchbridge", "safetensors", "torch.load")]
    if os.path.exists(args.device_load):
        runs.append((f"torchbridge to {args.device}",
                     [args.device_load, st_path, "--memory", "--device", f"{args.device}:0"], env))
    for name, command, child_env in runs:
        peak, retained = sample_peak(command, child_env)
        note = f"{retained / MiB:.0f} MiB of it still held after the load (the loaded tensors)"
        if name.startswith("torchbridge"):
            note += "; " + goal("peak <= largest tensor", peak <= largest)
        line(name, f"{peak / MiB:.0f} MiB peak", note)


def device_load(args, st_path, repeats, device, cold, env=None):
    command = [args.device_load, st_path, "--repeats", str(repeats), "--device", device] + (["--cold"] if cold else [])
    return json.loads(subprocess.run(command, env=env, check=True, capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1])


def load_to_emu(args, st_path, total, repeats, env):
    print("\nLoad to emu (C++ reader: direct copies from the file's mapping into device memory; baseline: one "
          "memcpy of as many bytes between two resident buffers):")
    for cache in ("warm", "cold"):
        result = device_load(args, st_path, repeats, "emu:0", cache == "cold", env)
        ratio = result["memcpy_s"] / result["direct_s"]
        line(f"emu load, {cache}", f"{result['direct_s']:.3f} s ({total / result['direct_s'] / 1e9:.2f} GB/s)",
             f"memcpy {total / result['memcpy_s'] / 1e9:.2f} GB/s; ratio {ratio:.2f}x; " + goal(">= 0.8x", ratio >= 0.8))
        line("  (information) memcpy out of the mapped file", f"{result['memcpy_from_file_s']:.3f} s",
             f"the same bytes into host memory; the load runs at "
             f"{result['memcpy_from_file_s'] / result['direct_s']:.2f}x this")
        line("  (information) staged through pinned", f"{result['staged_s']:.3f} s",
             f"2 x {result['chunk_mib']} MiB pinned buffers; {result['staged_s'] / result['direct_s']:.2f}x the "
             "direct load's time, so the reader does not stage")
        if cache == "warm":
            line("  (information) first load", f"{result['first_direct_s']:.3f} s",
                 "includes the emulator faulting in fresh device memory")


def load_to_gpu(args, st_path, total, repeats):
    """The C++ reader straight to the GPU (in its own process) against safetensors' own GPU load and
    against the host-to-device bandwidth of one pinned copy, all measured here."""
    device = f"{args.device}:0"
    module = getattr(torch, args.device)
    print(f"\nLoad to {device} (C++ reader: direct copies from the file's mapping into device memory):")
    pinned = torch.empty(total, dtype=torch.uint8).pin_memory()
    on_device = torch.empty(total, dtype=torch.uint8, device=device)

    def pinned_copy():
        on_device.copy_(pinned)
        module.synchronize()

    def safetensors_load():
        tensors = safetensors.torch.load_file(st_path, device=device)
        module.synchronize()
        del tensors

    bandwidth_s = timed(pinned_copy, repeats)
    line("(baseline) pinned host -> device copy", f"{bandwidth_s:.3f} s", f"{total / bandwidth_s / 1e9:.2f} GB/s")
    del on_device
    for cache in ("warm", "cold"):
        result = device_load(args, st_path, repeats, device, cache == "cold")
        reference_s = timed(safetensors_load, repeats, before=(lambda: evict(st_path)) if cache == "cold" else None)
        ours = result["direct_s"]
        vs_safetensors = reference_s / ours
        vs_bandwidth = bandwidth_s / ours
        line(f"{args.device} load, {cache}", f"{ours:.3f} s ({total / ours / 1e9:.2f} GB/s)",
             f"safetensors {reference_s:.3f} s; ratio {vs_safetensors:.2f}x; " + goal(">= 1x", vs_safetensors >= 1))
        # The baseline for the host side: the file's bytes copied out of the page cache
        # (one memcpy from the mapping, measured by the same program) plus the pinned copy above.
        host_path_s = result["memcpy_from_file_s"] + bandwidth_s
        vs_host_path = host_path_s / ours
        line(f"  speed / (file memcpy + pinned copy), {cache}", f"{vs_host_path:.2f}x",
             f"{result['memcpy_from_file_s']:.3f} s + {bandwidth_s:.3f} s; " + goal(">= 0.8x", vs_host_path >= 0.8))
        line(f"  (information) speed / pinned copy alone, {cache}", f"{vs_bandwidth:.2f}x",
             "the DMA without reading the file")
        line("  (information) staged through pinned", f"{result['staged_s']:.3f} s",
             f"{result['staged_s'] / ours:.2f}x the direct load's time")


if __name__ == "__main__":
    main()
