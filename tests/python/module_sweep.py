"""torch.nn's own module samples on an SDK device against the CPU.

Every ModuleInfo of torch.testing._internal.common_modules.module_db is run with its own
constructor and forward inputs, in float32 and float64, in training and in eval mode, once on the
CPU and once on the SDK device (same seed, same parameters, same inputs). A case agrees when the
forward outputs, the gradients of every parameter and input, and the buffers after the call match
the CPU's (or when the CPU raises and the device raises too). Modules listed in
EXPECTED_FAILURES must fail, each for the reason given; one that passes is reported as stale.

Modules run in worker processes (chunks), so a crash ends only the module that crashed: the driver
records it and starts a new worker for the rest of the chunk.

    python tests/python/module_sweep.py --device emu            # the whole sweep, 2 workers
    python tests/python/module_sweep.py --device cudasdk --jobs 1
    python tests/python/module_sweep.py --modules nn.LSTM,nn.GRU --verbose

Exit status 0 only when every module agreed or failed as expected, none crashed and no
expected-failure entry is stale.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# Module name -> why it cannot agree with the CPU on an SDK device. Reviewed entries only: each is
# a difference a user would accept, never a wrong number the device could avoid.
EXPECTED_FAILURES: "dict[str, str]" = {}

# Relative and absolute tolerance per dtype. The device runs torch's CPU kernels, so most results
# are bit-identical; the margin covers composites that take torch's non-CPU path, whose summation
# order differs from the CPU's: the fused recurrent cells, and attention, which on the CPU uses a
# flash-attention kernel and on a PrivateUse1 device torch's math path.
TOLERANCES = {"float32": (1e-4, 1e-5), "float64": (1e-10, 1e-10)}


def _load_device(name):
    import torch
    import torchbridge

    torchbridge.devices.load(name)
    return torch.device(name)


def _tensors(value):
    """The tensors of a (nested) forward result, in a fixed order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, torch.nn.utils.rnn.PackedSequence):
        return [value.data, value.batch_sizes]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for key in sorted(value) for t in _tensors(value[key])]
    return []


def _to_device(value, device):
    """`value` with every tensor moved to `device`; leaves keep requires_grad."""
    import torch

    if isinstance(value, torch.nn.utils.rnn.PackedSequence):
        return value.to(device)
    if isinstance(value, torch.Tensor):
        moved = value.detach().to(device)
        return moved.requires_grad_(value.requires_grad) if value.is_leaf else moved
    if isinstance(value, tuple):
        return tuple(_to_device(v, device) for v in value)
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


def _compare(what, cpu, dev, dtype_name):
    import torch

    rtol, atol = TOLERANCES[dtype_name]
    if len(cpu) != len(dev):
        return f"{what}: {len(cpu)} tensors on the CPU, {len(dev)} on the device"
    for i, (c, d) in enumerate(zip(cpu, dev)):
        if c is None or d is None:
            if (c is None) != (d is None):
                return f"{what}[{i}]: {'None' if c is None else 'a tensor'} on the CPU, " \
                       f"{'None' if d is None else 'a tensor'} on the device"
            continue
        try:
            torch.testing.assert_close(d.detach().cpu(), c.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                       check_device=False)
        except AssertionError as error:
            return f"{what}[{i}]: " + " ".join(str(error).split())[:400]
    return None


def _run_case(info, device, dtype, training, seed):
    """Runs every sample of one (module, dtype, mode); returns (samples, samples both sides refused,
    first disagreement or None)."""
    import torch

    dtype_name = str(dtype).replace("torch.", "")
    torch.manual_seed(seed)
    samples = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=training)
    refused = 0
    for index, sample in enumerate(samples):
        where = f"{dtype_name} {'train' if training else 'eval'} sample {index} ({sample.desc or 'default'})"
        c_args, c_kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
        f_args, f_kwargs = sample.forward_input.args, sample.forward_input.kwargs
        results = {}
        for side in ("cpu", "device"):
            target = torch.device("cpu") if side == "cpu" else device
            torch.manual_seed(seed + index)
            try:
                module = info.module_cls(*_to_device(c_args, target), **_to_device(c_kwargs, target))
                module = module.to(target).to(dtype)
                # Lazy modules initialise on their first forward, from the generators seeded alike.
                if side == "cpu" and not _has_lazy_parameters(module):
                    initial = {k: v.clone() for k, v in module.state_dict().items()}
                elif side == "device" and not _has_lazy_parameters(module):
                    module.load_state_dict(initial)  # the CPU module's state before its forward
                module.train(training)
                args, kwargs = _to_device(f_args, target), _to_device(f_kwargs, target)
                torch.manual_seed(seed + index)
                output = module(*args, **kwargs)
                outputs = _tensors(output)
                differentiable = [o for o in outputs if o.requires_grad]
                torch.manual_seed(seed + index + 1)
                grads_out = [torch.randn(o.shape, dtype=o.dtype).to(target) for o in differentiable]
                wrt = [p for _, p in module.named_parameters()] + [t for t in _tensors((args, kwargs))
                                                                   if t.requires_grad and t.is_leaf]
                grads = []
                if differentiable and wrt:
                    grads = list(torch.autograd.grad(differentiable, wrt, grads_out, allow_unused=True))
                buffers = [b for _, b in module.named_buffers()]
                results[side] = {"module": module, "outputs": outputs, "grads": grads, "buffers": buffers}
            except Exception as error:  # noqa: BLE001 - the CPU's own errors are part of the comparison
                results[side] = {"module": None, "error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
                if side == "cpu":
                    results["cpu"]["module"] = None
                    continue
        cpu, dev = results["cpu"], results["device"]
        if "error" in cpu or "error" in dev:
            if "error" in cpu and "error" in dev:
                refused += 1  # both refuse the sample
                continue
            side, error = ("device", dev["error"]) if "error" in dev else ("cpu", cpu["error"])
            return len(samples), refused, f"{where}: only the {side} raised: {error[:300]}"
        for what in ("outputs", "grads", "buffers"):
            problem = _compare(what, cpu[what], dev[what], dtype_name)
            if problem:
                return len(samples), refused, f"{where}: {problem}"
    return len(samples), refused, None


def _has_lazy_parameters(module):
    import torch

    return any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in module.parameters())


def _worker(device_name, names, results_path):
    import torch

    with open(results_path, "a", buffering=1) as results:
        # The device first: importing torch's test modules initialises CUDA on a GPU machine, and an
        # SDK device cannot be loaded into a process that already uses another accelerator (the
        # H200 run of 2026-11-26 refused emu here, "device 0 has a CUDA context").
        try:
            device = _load_device(device_name)
        except Exception as error:  # noqa: BLE001 - reported to the driver, which stops the sweep
            results.write(json.dumps({"event": "fatal", "error": f"cannot load device '{device_name}': {error}"}) + "\n")
            return
        from torch.testing._internal.common_modules import module_db

        by_name = {info.name: info for info in module_db}
        for name in names:
            results.write(json.dumps({"event": "start", "module": name}) + "\n")
            info = by_name[name]
            seed = sum(map(ord, name))
            cases, problems, samples, refused = 0, [], 0, 0
            start = time.monotonic()
            for dtype in (torch.float32, torch.float64):
                if dtype not in info.dtypes:
                    continue
                for training in (True, False):
                    cases += 1
                    count, both_refused, problem = _run_case(info, device, dtype, training, seed)
                    samples += count
                    refused += both_refused
                    if problem:
                        problems.append(problem)
            results.write(json.dumps({"event": "done", "module": name, "cases": cases, "samples": samples,
                                      "refused": refused,
                                      "problems": problems, "seconds": round(time.monotonic() - start, 2)}) + "\n")


def _all_module_names():
    from torch.testing._internal.common_modules import module_db

    return [info.name for info in module_db]


def _drive(args):
    known = _all_module_names()
    names = args.modules.split(",") if args.modules else known
    for what, listed in (("--modules", names), ("EXPECTED_FAILURES", EXPECTED_FAILURES)):
        unknown = sorted(set(listed) - set(known))
        if unknown:
            sys.exit(f"{what} names modules that module_db does not have: {', '.join(unknown)} "
                     f"(known: {', '.join(known)})")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="module_sweep_") as workdir:
        done, crashed = _run_workers(args, names, workdir)
    return _report(args, names, done, crashed, time.monotonic() - start)


def _run_workers(args, names, workdir):
    """Runs the modules in --jobs workers; a worker that dies is replaced for the rest of its chunk."""
    chunks = [names[i::args.jobs] for i in range(args.jobs)]
    done, crashed = {}, {}
    pending = [chunk for chunk in chunks if chunk]
    running = []
    serial = 0
    while pending or running:
        while pending and len(running) < args.jobs:
            chunk = pending.pop(0)
            serial += 1
            path = os.path.join(workdir, f"worker{serial}.jsonl")
            command = [sys.executable, os.path.abspath(__file__), "--worker", "--device", args.device,
                       "--modules", ",".join(chunk), "--results", path]
            log = open(path + ".log", "w")
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            running.append({"process": process, "chunk": chunk, "path": path, "log": log,
                            "progress": time.monotonic(), "lines": 0})
        time.sleep(0.5)
        for worker in list(running):
            text = open(worker["path"]).read() if os.path.exists(worker["path"]) else ""
            lines = text.split("\n")[:-1]  # only whole lines: the worker may be writing one
            if len(lines) != worker["lines"]:
                worker["lines"], worker["progress"] = len(lines), time.monotonic()
            events = [json.loads(line) for line in lines]
            fatal = [e["error"] for e in events if e["event"] == "fatal"]
            if fatal:
                for other in running:
                    other["process"].kill()
                sys.exit(f"module sweep: {fatal[0]}")
            finished = {e["module"]: e for e in events if e["event"] == "done"}
            started = [e["module"] for e in events if e["event"] == "start"]
            stuck = time.monotonic() - worker["progress"] > args.module_timeout
            if stuck:
                worker["process"].kill()
            code = worker["process"].poll()
            if code is None:
                continue
            running.remove(worker)
            worker["log"].close()
            done.update(finished)
            rest = [name for name in worker["chunk"] if name not in finished]
            if rest:
                culprit = started[-1] if started and started[-1] not in finished else rest[0]
                tail = open(worker["path"] + ".log").read().strip().splitlines()[-3:]
                reason = "no progress for %d s" % args.module_timeout if stuck else f"worker exited with {code}"
                crashed[culprit] = f"{reason}: {' | '.join(tail)[:400]}"
                rest = [name for name in rest if name != culprit]
                if rest:
                    pending.append(rest)
    return done, crashed


def _report(args, names, done, crashed, elapsed):
    agreed, expected, failed, stale = [], [], [], []
    for name in names:
        if name in crashed:
            continue
        result = done[name]
        problems = result["problems"]
        if name in EXPECTED_FAILURES:
            (expected if problems else stale).append(name)
        elif problems:
            failed.append(name)
        else:
            agreed.append(name)
        if args.verbose or (problems and name not in EXPECTED_FAILURES):
            status = "FAIL" if problems else "ok"
            print(f"{status:4} {name} ({result['cases']} cases, {result['samples']} samples, {result['seconds']} s)")
            for problem in problems[: (None if args.verbose else 3)]:
                print(f"       {problem}")
    for name in expected:
        print(f"xfail {name}: {EXPECTED_FAILURES[name]}")
        for problem in done[name]["problems"][:2]:
            print(f"       {problem}")
    for name in stale:
        print(f"STALE {name}: listed as an expected failure ({EXPECTED_FAILURES[name]}) but agrees")
    for name, reason in crashed.items():
        print(f"CRASH {name}: {reason}")
    cases = sum(done[n]["cases"] for n in done)
    samples = sum(done[n]["samples"] for n in done)
    refused = sum(done[n]["refused"] for n in done)
    guarded = os.environ.get("TORCHBRIDGE_EMU_GUARDED", "1")
    mode = f" (TORCHBRIDGE_EMU_GUARDED={guarded})" if args.device == "emu" else ""
    print(f"module sweep on {args.device}{mode}: {len(names)} modules tried ({cases} dtype/mode cases, "
          f"{samples} samples, {refused} refused by the CPU and the device alike): {len(agreed)} agreed, {len(expected)} expected failures, {len(failed)} failed, "
          f"{len(crashed)} crashed, {len(stale)} stale expected failures; {elapsed:.0f} s with {args.jobs} workers")
    return 0 if not failed and not crashed and not stale else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="emu", help="SDK device to compare with the CPU (default: emu)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default: 2)")
    parser.add_argument("--modules", help="comma-separated ModuleInfo names (default: all of module_db)")
    parser.add_argument("--module-timeout", type=int, default=300,
                        help="seconds without progress before a worker counts as hung (default: 300)")
    parser.add_argument("--verbose", action="store_true", help="print every module and every disagreement")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.worker:
        _worker(args.device, args.modules.split(","), args.results)
        return 0
    return _drive(args)


if __name__ == "__main__":
    sys.exit(main())
