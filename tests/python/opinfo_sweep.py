"""PyTorch's own OpInfo database as the oracle for an SDK device.

For every OpInfo in torch.testing._internal.common_methods_invocations.op_db and every dtype of
DTYPES the CPU supports for it, the op's sample inputs are generated on the SDK device (as
upstream's test_compare_cpu does: sample functions know which extra arguments must stay on the
CPU), copied to the CPU, and the op runs on both; outputs must agree, and for floating and complex
dtypes the op supports in autograd, so must the gradients. Operators whose output depends on the
random generator (found by running the CPU reference under two seeds) or whose content is
undefined (empty*) are compared by properties and statistics instead of values.

Isolation: pairs run in worker subprocesses fed one pair at a time; a worker that dies (a crash)
or stops making progress (a hang) is recorded against the pair it was running and replaced, so
one crash cannot hide the rest.

    python tests/python/opinfo_sweep.py --device emu [--jobs 2] [--dtypes float32,bool]
        [--ops REGEX] [--shard I/N] [--results FILE.jsonl] [--summary FILE.json]

The device is any SDK device name (emu, cudasdk, ...); it is loaded by name in each worker.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import selectors
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DTYPE_NAMES = ("float32", "float64", "bfloat16", "complex64", "int64", "bool")
# Sample inputs in these layouts, for the OpInfos that support each (OpInfo.supports_sparse_layout).
LAYOUTS = ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
SEED = 1234
# Content undefined by definition: compared by shape, dtype and device only.
UNDEFINED_CONTENT_OPS = frozenset(
    {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"})
# Rounding differences allowed beyond assert_close's tolerances, relative to the largest magnitude
# of the result (see _compare_values): about four units in the last place of bfloat16, and for the
# wider types far below what a defect in the glue (wrong layout, stale or lost data) produces
# while above what reordered float32 accumulation in a long backward formula does.
SCALED_TOLERANCE = {"bfloat16": 2.0 ** -5, "float32": 1e-5, "complex64": 1e-5, "float64": 1e-10,
                    "complex128": 1e-10}
# Statistics are only meaningful with enough elements.
MIN_ELEMENTS_FOR_STATISTICS = 32


# ================================================================================================
# Worker side: runs (op, dtype) pairs in a process that has loaded the SDK device.
# ================================================================================================

class Disagreement(Exception):
    """The device's result differs from the CPU's."""


def _flatten(value, out):
    if isinstance(value, (list, tuple)):
        for item in value:
            _flatten(item, out)
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            _flatten(value[key], out)
    else:
        out.append(value)
    return out


def _sample_to_cpu(sample, device_type):
    """The device sample with every device tensor copied to the CPU, and device arguments
    (factory functions' device=) naming the CPU; CPU tensors stay as they are. Copies keep what an
    operator can observe: each is the same view (sizes, strides, offset, math bits) of a copy of its
    whole storage (as_strided over a partial view looks past the view); tensors sharing a storage
    share the copy; a view of another tensor (a `_base`) stays a view of that tensor's copy, which
    decides what autograd differentiates; requires_grad is kept."""
    import torch

    storages, tensors = {}, {}

    def copy_tensor(t):
        if id(t) in tensors:
            return tensors[id(t)]
        if t.layout != torch.strided:
            copy = t.detach().to("cpu").requires_grad_(t.requires_grad)
        elif t._base is not None and t._base.device.type == device_type and _retyped(t._base, t.dtype) is not None:
            base = copy_tensor(t._base)
            with torch.no_grad():
                copy = _with_math_bits(_retyped(base, t.dtype).as_strided(t.size(), t.stride(), t.storage_offset()), t)
            if t.requires_grad and not copy.requires_grad:
                copy.requires_grad_()
        else:
            key = t.untyped_storage().data_ptr()
            if key not in storages:
                with torch.no_grad():
                    storages[key] = t.untyped_storage().cpu()
            copy = torch.empty(0, dtype=t.dtype).set_(storages[key], t.storage_offset(), t.size(), t.stride())
            copy = _with_math_bits(copy, t).requires_grad_(t.requires_grad)
        tensors[id(t)] = copy
        return copy

    def convert(value):
        if isinstance(value, torch.Tensor):
            return value if value.device.type != device_type else copy_tensor(value)
        if isinstance(value, torch.device) and value.type == device_type:
            return torch.device("cpu")
        if isinstance(value, str) and value.split(":")[0] == device_type:
            return "cpu"
        if isinstance(value, list):
            return [convert(v) for v in value]
        if isinstance(value, tuple):
            return tuple(convert(v) for v in value)
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        return value

    return convert(sample.input), convert(sample.args), convert(sample.kwargs)


def _with_device_values(cpu_sample, sample, device_type):
    """`cpu_sample` (the same sample function run for the CPU) holding the device sample's values:
    it has the autograd structure the sample function gives (leaf views, conjugate views of
    leaves), which copying tensors cannot reproduce. None when the two samples differ in
    structure, shape or dtype (then _sample_to_cpu is used)."""
    import torch

    cpu_leaves = _flatten([cpu_sample.input, cpu_sample.args, cpu_sample.kwargs], [])
    leaves = _flatten([sample.input, sample.args, sample.kwargs], [])
    if len(cpu_leaves) != len(leaves):
        return None
    pairs = []
    for c, d in zip(cpu_leaves, leaves):
        if isinstance(c, torch.Tensor) != isinstance(d, torch.Tensor):
            return None
        if isinstance(d, torch.Tensor):
            if c.layout != torch.strided or d.layout != torch.strided:
                return None
            if (c.shape, c.dtype, c.stride(), c.storage_offset(), c.is_conj(), c.is_neg(), c.requires_grad) != (
                    d.shape, d.dtype, d.stride(), d.storage_offset(), d.is_conj(), d.is_neg(), d.requires_grad):
                return None
            if c.untyped_storage().nbytes() != d.untyped_storage().nbytes():
                return None
            pairs.append((c, d))
        elif isinstance(d, torch.device) or (isinstance(d, str) and d.split(":")[0] == device_type):
            continue  # device arguments name the CPU in the CPU sample
        elif not _plain_equal(c, d):
            return None
    with torch.no_grad():
        for c, d in pairs:  # whole storages: operators may look past a view
            c.untyped_storage().copy_(d.untyped_storage())
    return cpu_sample.input, cpu_sample.args, cpu_sample.kwargs


def _plain_equal(a, b):
    try:
        return bool(a == b) or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
    except Exception:  # noqa: BLE001 - values that do not compare (callables): same type is enough
        return type(a) is type(b)


def _retyped(base, dtype):
    """`base` viewed as `dtype` over the same storage (complex as its real dtype, or the same
    element size), or None."""
    import torch

    if base.dtype == dtype:
        return base
    if base.is_complex() and base.real.dtype == dtype:
        return torch.view_as_real(base)
    if base.element_size() == torch.empty(0, dtype=dtype).element_size() and base.dim() > 0:
        return base.view(dtype)
    return None


def _with_math_bits(copy, like):
    import torch

    if like.is_conj():
        copy = copy.conj()
    if like.is_neg():
        copy = torch._neg_view(copy)
    return copy


def _uses_device(arguments, device_type):
    import torch

    for leaf in _flatten(list(arguments), []):
        if isinstance(leaf, torch.Tensor) and leaf.device.type == device_type:
            return True
        if isinstance(leaf, torch.device) and leaf.type == device_type:
            return True
        if isinstance(leaf, str) and leaf.split(":")[0] == device_type:
            return True
    return False


def _names_the_cpu(arguments):
    """Whether an explicit device argument asks for the CPU (then outputs may live there)."""
    import torch

    for leaf in _flatten(list(arguments), []):
        if isinstance(leaf, torch.device) and leaf.type == "cpu":
            return True
        if isinstance(leaf, str) and leaf.split(":")[0] == "cpu":
            return True
    return False


def _dense_cpu(t):
    import torch

    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    return t.cpu().resolve_conj().resolve_neg()


def _bytes(t):
    import torch

    return torch.empty(t.numel(), dtype=t.dtype).copy_(t.reshape(-1)).view(torch.uint8)


def _same_values(a, b):
    """Bit-for-bit equality (for telling whether two CPU runs of an operator differ)."""
    import torch

    fa, fb = _flatten([a], []), _flatten([b], [])
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            x, y = _dense_cpu(x), _dense_cpu(y)
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if x.dtype != torch.bool and x.element_size() > 0:
                x, y = _bytes(x), _bytes(y)
            if not torch.equal(x, y):
                return False
        elif x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
            return False
    return True


def _check_statistics(actual, expected, what):
    import torch

    a = _dense_cpu(actual).to(torch.complex128 if actual.is_complex() else torch.float64).flatten()
    e = _dense_cpu(expected).to(a.dtype).flatten()
    if a.numel() < MIN_ELEMENTS_FOR_STATISTICS:
        return
    if a.is_complex():
        a, e = torch.view_as_real(a).flatten(), torch.view_as_real(e).flatten()
    a, e = a[a.isfinite()], e[e.isfinite()]
    if a.numel() < MIN_ELEMENTS_FOR_STATISTICS or e.numel() < MIN_ELEMENTS_FOR_STATISTICS:
        return
    # Two independent samples of one distribution: means within 6 standard errors, spreads within 50%.
    standard_error = math.sqrt((a.var().item() + e.var().item()) / min(a.numel(), e.numel())) + 1e-12
    if abs(a.mean().item() - e.mean().item()) > 6 * standard_error + 1e-6:
        raise Disagreement(f"{what}: mean {a.mean().item():.6g} vs CPU {e.mean().item():.6g} "
                           f"(standard error {standard_error:.3g})")
    sa, se = a.std().item(), e.std().item()
    if abs(sa - se) > 0.5 * max(sa, se) + 1e-6:
        raise Disagreement(f"{what}: standard deviation {sa:.6g} vs CPU {se:.6g}")


def _compare_values(a, e, where, rounding):
    """torch's assert_close tolerances for the dtype; failing those, floating results may still
    differ by rounding alone: at most SCALED_TOLERANCE times the result's largest magnitude. That
    happens where torch runs a CompositeExplicitAutograd decomposition on the device and one fused
    kernel on the CPU (addr: beta*M + alpha*outer(u, v), each step rounded to bfloat16), or where a
    kernel picks its path by memory layout. Pairs that needed this test are counted (`rounding`)."""
    import torch

    try:
        torch.testing.assert_close(a, e, equal_nan=True, check_device=False, check_stride=False)
        return
    except AssertionError as error:
        tight_error = " ".join(str(error).split())[:400]
    if not (e.is_floating_point() or e.is_complex()) or e.numel() == 0:
        raise Disagreement(f"{where}: {tight_error}")
    finite = e.isfinite()
    if not torch.equal(finite, a.isfinite()) or not torch.equal(e.isnan(), a.isnan()):
        raise Disagreement(f"{where}: {tight_error}")
    wide = torch.complex128 if e.is_complex() else torch.float64
    ad, ed = a.to(wide)[finite], e.to(wide)[finite]
    if not torch.equal(a[~finite & ~a.isnan()], e[~finite & ~e.isnan()]):  # infinities of the same sign
        raise Disagreement(f"{where}: {tight_error}")
    if ed.numel() == 0:
        return
    scale = ed.abs().max().item()
    relative = SCALED_TOLERANCE.get(str(e.dtype).replace("torch.", ""))
    if relative is None:
        raise Disagreement(f"{where}: {tight_error}")
    bound = relative * scale
    worst = (ad - ed).abs().max().item()
    if worst > bound:
        raise Disagreement(f"{where}: {tight_error}; largest difference {worst:.3g} exceeds "
                           f"{relative:.3g} of the largest magnitude ({bound:.3g})")
    rounding[0] = True


def _compare(actual, expected, device_type, on_device, how, what, rounding=None):
    """Raises Disagreement unless `actual` (device run) matches `expected` (CPU run).
    how: "values", "statistics" (random output) or "properties" (undefined content)."""
    import torch

    rounding = rounding if rounding is not None else [False]
    fa, fe = _flatten([actual], []), _flatten([expected], [])
    if len(fa) != len(fe):
        raise Disagreement(f"{what}: {len(fa)} outputs vs {len(fe)} on the CPU")
    for index, (a, e) in enumerate(zip(fa, fe)):
        where = f"{what}[{index}]"
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Disagreement(f"{where}: {type(a).__name__} instead of a tensor")
            if on_device and e.device.type == "cpu" and a.device.type != device_type:
                raise Disagreement(f"{where}: result on {a.device}, expected on the {device_type} device")
            if a.dtype != e.dtype:
                raise Disagreement(f"{where}: dtype {a.dtype} vs CPU {e.dtype}")
            if a.shape != e.shape:
                raise Disagreement(f"{where}: shape {tuple(a.shape)} vs CPU {tuple(e.shape)}")
            if a.layout != e.layout:
                raise Disagreement(f"{where}: layout {a.layout} vs CPU {e.layout}")
            if how == "properties":
                continue
            if how == "statistics":
                _check_statistics(a, e, where)
                continue
            _compare_values(_dense_cpu(a), _dense_cpu(e), where, rounding)
        elif isinstance(a, torch.Tensor):
            raise Disagreement(f"{where}: a tensor instead of {type(e).__name__}")
        elif isinstance(e, float) and isinstance(a, float):
            if not (math.isclose(a, e, rel_tol=1e-5, abs_tol=1e-6) or (math.isnan(a) and math.isnan(e))):
                if how == "values":
                    raise Disagreement(f"{where}: {a!r} vs CPU {e!r}")
        elif isinstance(e, torch.dtype) or isinstance(e, (int, bool, str, type(None), torch.Size)):
            if a != e and how == "values":
                raise Disagreement(f"{where}: {a!r} vs CPU {e!r}")


def _random_like(t):
    import torch

    return torch.randn(t.shape, dtype=t.dtype) if (t.is_floating_point() or t.is_complex()) else None


def _message(error):
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:400]}"


def _samples(op, device, dtype, with_backward, layout):
    import torch

    if layout == "strided":
        return list(op.sample_inputs(device, dtype, requires_grad=with_backward))
    return list(op.sample_inputs_sparse(getattr(torch, layout), device, dtype, requires_grad=with_backward))


def run_pair(op, dtype, device, with_backward, max_samples=None, layout="strided"):
    """Compares `op` on `device` with the CPU for one dtype and one layout of its sample inputs
    (strided, or a sparse layout the OpInfo supports). Returns a result dict with status "agree",
    "disagree" (a different result), "error" (the device raised, the CPU did not) or "no_samples"
    (the CPU rejected every sample), and details of the first failure."""
    import unittest

    import torch

    device_type = torch.device(device).type
    counts = {"samples": 0, "cpu_rejected": 0, "random": 0, "backward_checked": 0}
    result = {"status": "agree", **counts}
    rounding = [False]  # set when a comparison needed the rounding allowance
    try:
        torch.manual_seed(SEED)
        samples = _samples(op, device, dtype, with_backward, layout)
        try:  # the same samples built on the CPU: their autograd structure, the device's values
            torch.manual_seed(SEED)
            cpu_samples = _samples(op, "cpu", dtype, with_backward, layout)
        except Exception:  # noqa: BLE001
            cpu_samples = []
    except unittest.SkipTest:  # the sample function has none for this layout
        samples = []
    except Exception as error:  # noqa: BLE001 - a finding, unless the CPU cannot build them either
        try:
            torch.manual_seed(SEED)
            _samples(op, "cpu", dtype, with_backward, layout)
        except Exception:  # noqa: BLE001 - e.g. "no sample function specified" for a layout
            result.update(status="no_samples", detail=f"no samples on the CPU either: {_message(error)}")
            return result
        result.update(status="error", phase="sample generation on the device", detail=_message(error))
        return result
    if max_samples is not None:
        samples = samples[:max_samples]
    for index, sample in enumerate(samples):
        phase = "forward"
        try:
            cpu_input, cpu_args, cpu_kwargs = (
                _with_device_values(cpu_samples[index], sample, device_type) if index < len(cpu_samples) else None
            ) or _sample_to_cpu(sample, device_type)
            on_device = (_uses_device((sample.input, sample.args, sample.kwargs), device_type)
                         and not _names_the_cpu((sample.args, sample.kwargs)))
            # The CPU reference, twice under different seeds: outputs that differ depend on the
            # generator (or are undefined), and are compared by statistics/properties only.
            try:
                torch.manual_seed(SEED)
                expected = op(cpu_input, *cpu_args, **cpu_kwargs)
                expected = sample.output_process_fn_grad(expected)
                # (in the same grad mode: some kernels choose their algorithm by it)
                i2, a2, k2 = _sample_to_cpu(sample, device_type)
                torch.manual_seed(SEED + 1)
                again = sample.output_process_fn_grad(op(i2, *a2, **k2))
            except Exception:  # noqa: BLE001 - the CPU rejects this sample: nothing to compare
                result["cpu_rejected"] += 1
                continue
            if op.name in UNDEFINED_CONTENT_OPS:
                how = "properties"
            elif not _same_values(expected, again):
                how = "statistics"
                result["random"] += 1
            else:
                how = "values"
            torch.manual_seed(SEED)
            actual = op(sample.input, *sample.args, **sample.kwargs)
            actual = sample.output_process_fn_grad(actual)
            _compare(actual, expected, device_type, on_device, how, f"sample {index} output", rounding)
            result["samples"] += 1

            if with_backward and how == "values":
                phase = "backward"
                _compare_gradients(sample, (cpu_input, cpu_args, cpu_kwargs), actual, expected, device,
                                   f"sample {index} gradient", result, rounding)
        except Disagreement as error:
            result.update(status="disagree", phase=phase, sample=index, detail=str(error))
            return result
        except Exception as error:  # noqa: BLE001 - the device raised where the CPU did not
            result.update(status="error", phase=phase, sample=index, detail=_message(error),
                          where=traceback.format_exc(limit=-3)[-600:])
            return result
    if result["samples"] == 0:
        result["status"] = "no_samples"
    result["rounding"] = rounding[0]
    return result


def _compare_gradients(sample, cpu_arguments, actual, expected, device, what, result, rounding):
    import torch

    device_leaves = [t for t in _flatten([sample.input, sample.args, sample.kwargs], [])
                     if isinstance(t, torch.Tensor) and t.requires_grad]
    cpu_leaves = [t for t in _flatten(list(cpu_arguments), [])
                  if isinstance(t, torch.Tensor) and t.requires_grad]
    if not device_leaves or len(device_leaves) != len(cpu_leaves):
        return
    outputs = [(a, e) for a, e in zip(_flatten([actual], []), _flatten([expected], []))
               if isinstance(e, torch.Tensor) and e.requires_grad and e.grad_fn is not None
               and isinstance(a, torch.Tensor) and (e.is_floating_point() or e.is_complex())]
    if not outputs:
        return
    torch.manual_seed(SEED)
    cotangents = [_random_like(e) for _, e in outputs]
    try:
        expected_grads = torch.autograd.grad([e for _, e in outputs], cpu_leaves, cotangents, allow_unused=True)
    except Exception:  # noqa: BLE001 - not differentiable on the CPU either
        return
    actual_grads = torch.autograd.grad([a for a, _ in outputs], device_leaves,
                                       [c.to(a.device) for c, (a, _) in zip(cotangents, outputs)],
                                       allow_unused=True)
    for k, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        if (a is None) != (e is None):
            raise Disagreement(f"{what}[{k}]: {'none' if a is None else 'a gradient'} vs CPU "
                               f"{'none' if e is None else 'a gradient'}")
    _compare([g for g in actual_grads if g is not None], [g for g in expected_grads if g is not None],
             torch.device(device).type, True, "values", what, rounding)
    result["backward_checked"] += 1


def worker_main(device, result_fd, max_samples):
    """Reads tasks (JSON lines) from stdin; for each writes {"start": id} then the result."""
    import warnings

    warnings.simplefilter("ignore")
    import torch

    import torchbridge

    torch.set_num_threads(1)
    torchbridge.devices.load(device)
    from torch.testing._internal.common_methods_invocations import op_db

    by_name = {op.full_name: op for op in op_db}
    # Test hook: the sweep's own tests make the worker die on this OpInfo, as a crashing operator
    # would, to check that the crash is attributed to it and the remaining pairs still run.
    crash_on = os.environ.get("TORCHBRIDGE_OPINFO_SWEEP_CRASH_ON")
    out = os.fdopen(result_fd, "w", buffering=1)
    # How the fallback runs CPU kernels on this device (the expected-failure list may depend on it).
    from torchbridge.backends import BackendFactory

    in_place = BackendFactory.create(device).get_device_info().features.unified_memory
    out.write(json.dumps({"ready": True, "mode": "in_place" if in_place else "copying"}) + "\n")
    for line in sys.stdin:
        task = json.loads(line)
        out.write(json.dumps({"start": task["id"]}) + "\n")
        started = time.monotonic()
        op = by_name[task["op"]]
        if task["op"] == crash_on:
            os.kill(os.getpid(), 11)  # SIGSEGV
        result = run_pair(op, getattr(torch, task["dtype"]), device, task["backward"], max_samples, task["layout"])
        result.update(id=task["id"], op=task["op"], dtype=task["dtype"], backward=task["backward"],
                      layout=task["layout"],
                      seconds=round(time.monotonic() - started, 3))
        out.write(json.dumps(result) + "\n")


# ================================================================================================
# Parent side: enumerates pairs, feeds workers, survives their crashes, summarizes.
# ================================================================================================

def enumerate_tasks(dtype_names=DTYPE_NAMES, op_pattern=None, shard=None, layouts=LAYOUTS):
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    ops = sorted(op_db, key=lambda op: op.full_name)
    if op_pattern:
        ops = [op for op in ops if re.search(op_pattern, op.full_name)]
    if shard:
        index, count = shard
        ops = [op for k, op in enumerate(ops) if k % count == index]
    tasks = []
    for op in ops:
        supported = op.supported_dtypes("cpu")
        backward = op.supported_backward_dtypes("cpu") if op.supports_autograd else set()
        for layout in layouts:
            if layout != "strided" and not op.supports_sparse_layout(getattr(torch, layout)):
                continue
            for name in dtype_names:
                dtype = getattr(torch, name)
                if dtype not in supported:
                    continue
                # Gradients are compared for strided samples (sparse autograd is a topic of its own)
                with_backward = (layout == "strided" and dtype in backward
                                 and (dtype.is_floating_point or dtype.is_complex))
                tasks.append({"id": len(tasks), "op": op.full_name, "dtype": name, "layout": layout,
                              "backward": with_backward})
    return tasks


@dataclass
class _Worker:
    process: subprocess.Popen
    reader: object
    buffer: str = ""
    ready: bool = False
    task: dict | None = None
    since: float = field(default_factory=time.monotonic)
    stderr_path: str = ""


class Sweep:
    def __init__(self, device, tasks, jobs, timeout, max_samples, log_dir, progress):
        self.device, self.timeout, self.max_samples = device, timeout, max_samples
        self.pending = list(reversed(tasks))
        self.jobs = max(1, min(jobs, len(tasks))) if tasks else 0
        self.results = {}
        self.log_dir = log_dir
        self.progress = progress
        self.total = len(tasks)
        self.selector = selectors.DefaultSelector()
        self.spawned = 0
        self.mode = None  # "copying" or "in_place", as the first worker reports

    def _spawn(self):
        read_fd, write_fd = os.pipe()
        self.spawned += 1
        stderr_path = os.path.join(self.log_dir, f"worker-{self.spawned}.stderr")
        stderr = open(stderr_path, "w")
        command = [sys.executable, os.path.abspath(__file__), "--worker", "--device", self.device,
                   "--result-fd", str(write_fd)]
        if self.max_samples is not None:
            command += ["--max-samples", str(self.max_samples)]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr,
                                   pass_fds=(write_fd,), text=True)
        stderr.close()
        os.close(write_fd)
        reader = os.fdopen(read_fd, "r")
        os.set_blocking(read_fd, False)
        worker = _Worker(process, reader, stderr_path=stderr_path)
        self.selector.register(reader, selectors.EVENT_READ, worker)
        return worker

    def _feed(self, worker):
        if not self.pending:
            worker.process.stdin.close()
            return False
        worker.task = self.pending.pop()
        worker.since = time.monotonic()
        worker.process.stdin.write(json.dumps(worker.task) + "\n")
        worker.process.stdin.flush()
        return True

    def _record(self, result):
        result.setdefault("mode", self.mode)
        self.results[result["id"]] = result
        if self.progress:
            done = len(self.results)
            mark = {"agree": ".", "no_samples": "-"}.get(result["status"], "x")
            print(f"[{done}/{self.total}] {mark} {pair_name(result)} {result['dtype']} {result['status']}"
                  + (f" ({result.get('detail', '')[:120]})" if mark == "x" else ""), file=sys.stderr, flush=True)

    def _lost(self, worker, status, detail):
        self.selector.unregister(worker.reader)
        worker.reader.close()
        if worker.process.poll() is None:
            worker.process.kill()
        worker.process.wait()
        if worker.task is not None:
            with open(worker.stderr_path, errors="replace") as f:
                tail = f.read()[-800:]
            task = worker.task
            self._record({**{k: task[k] for k in ("id", "op", "dtype", "layout", "backward")}, "status": status,
                          "detail": f"{detail}; worker stderr tail: {' '.join(tail.split())[-500:]}"})
            worker.task = None

    def run(self):
        workers = [self._spawn() for _ in range(self.jobs)]
        live = len(workers)
        while live:
            events = self.selector.select(timeout=5)
            for key, _ in events:
                worker = key.data
                try:
                    chunk = worker.reader.read()
                except (BlockingIOError, TypeError):
                    chunk = None
                if chunk is None:
                    continue
                if chunk == "":  # EOF: the worker exited
                    code = worker.process.wait()
                    if not worker.ready:
                        with open(worker.stderr_path, errors="replace") as f:
                            tail = f.read()[-2000:]
                        raise RuntimeError(f"a sweep worker for device {self.device!r} failed to start "
                                           f"(exit code {code}):\n{tail}")
                    if worker.task is not None or code != 0:
                        reason = f"signal {-code}" if code < 0 else f"exit code {code}"
                        self._lost(worker, "crash", f"worker died ({reason})")
                    else:
                        self.selector.unregister(worker.reader)
                        worker.reader.close()
                    live -= 1
                    if self.pending:
                        self._spawn()
                        live += 1
                    continue
                worker.buffer += chunk
                while "\n" in worker.buffer:
                    line, worker.buffer = worker.buffer.split("\n", 1)
                    message = json.loads(line)
                    if "ready" in message:
                        worker.ready = True
                        self.mode = message["mode"]
                        self._feed(worker)
                    elif "start" in message:
                        worker.since = time.monotonic()
                    else:
                        self._record(message)
                        worker.task = None
                        self._feed(worker)
            now = time.monotonic()
            for key in list(self.selector.get_map().values()):
                worker = key.data
                if not worker.ready and now - worker.since > max(self.timeout, 600):
                    raise RuntimeError(f"a sweep worker for device {self.device!r} did not start in time")
                if worker.task is not None and now - worker.since > self.timeout:
                    self._lost(worker, "timeout", f"no result after {self.timeout} s")
                    live -= 1
                    if self.pending:
                        self._spawn()
                        live += 1
        return [self.results[k] for k in sorted(self.results)]


def pair_name(result):
    """The OpInfo's full name, with "@layout" for sparse sample layouts (the expected-failure key)."""
    layout = result.get("layout", "strided")
    return result["op"] if layout == "strided" else f"{result['op']}@{layout}"


def summarize(results, expected_failures):
    """Classifies results against the reviewed expected-failure list."""
    from opinfo_expected_failures import MachineDependent, lookup

    summary = {"pairs": len(results), "applicable": 0, "agreed": 0, "expected_failures": 0,
               "unexpected_failures": 0, "unexpected_passes": 0, "crashes": 0, "timeouts": 0, "no_samples": 0,
               "random_compared_by_statistics": 0, "backward_pairs": 0, "agreed_within_rounding": 0,
               "sparse_layout_pairs": 0, "sparse_layout_agreed": 0, "no_samples_strided": 0}
    unexpected, passes = [], []
    for r in results:
        status = r["status"]
        if status == "no_samples":
            summary["no_samples"] += 1
            summary["no_samples_strided"] += r.get("layout", "strided") == "strided"
            continue
        summary["applicable"] += 1
        if r.get("random"):
            summary["random_compared_by_statistics"] += 1
        if r.get("backward"):
            summary["backward_pairs"] += 1
        reason = lookup(expected_failures, pair_name(r), r["dtype"], r.get("mode"))
        if r.get("layout", "strided") != "strided":
            summary["sparse_layout_pairs"] += 1
            summary["sparse_layout_agreed"] += status == "agree"
        if status == "crash":
            summary["crashes"] += 1
        elif status == "timeout":
            summary["timeouts"] += 1
        if status == "agree":
            summary["agreed"] += 1
            summary["agreed_within_rounding"] += bool(r.get("rounding"))
            if reason is not None and not isinstance(reason, MachineDependent):
                summary["unexpected_passes"] += 1
                passes.append(r)
        elif reason is not None and status not in ("crash", "timeout"):
            summary["expected_failures"] += 1
            r["expected_reason"] = reason
        else:
            summary["unexpected_failures"] += 1
            unexpected.append(r)
    applicable = summary["applicable"]
    summary["agreement_percent"] = round(100.0 * summary["agreed"] / applicable, 2) if applicable else None
    summary["agreement_or_expected_percent"] = (
        round(100.0 * (summary["agreed"] + summary["expected_failures"]) / applicable, 2) if applicable else None)
    return summary, unexpected, passes


def format_table(summary, device, seconds):
    rows = [("device", device), ("fallback mode", summary.get("fallback_mode", "")),
            ("(op, dtype) pairs tried", summary["applicable"]),
            ("agreed with the CPU", f"{summary['agreed']} ({summary['agreement_percent']}%)"),
            ("  of which within rounding only", summary["agreed_within_rounding"]),
            ("expected failures (reviewed list)", summary["expected_failures"]),
            ("unexpected failures", summary["unexpected_failures"]),
            ("crashes", summary["crashes"]), ("hangs (timeouts)", summary["timeouts"]),
            ("expected failures that now pass", summary["unexpected_passes"]),
            ("pairs with backward checked", summary["backward_pairs"]),
            ("pairs with sparse sample layouts (agreed)",
             f"{summary['sparse_layout_pairs']} ({summary['sparse_layout_agreed']})"),
            ("pairs compared by statistics (random ops)", summary["random_compared_by_statistics"]),
            ("pairs without sample inputs (not counted)",
             f"{summary['no_samples']} ({summary['no_samples_strided']} strided: CUDA-only jiterator OpInfos or "
             f"every sample rejected by the CPU; the rest sparse layouts without a sample function)"),
            ("run time", f"{seconds:.0f} s")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def run(device, tasks, jobs=1, timeout=300, max_samples=None, progress=False, log_dir=None):
    import tempfile

    log_dir = log_dir or tempfile.mkdtemp(prefix="opinfo-sweep-")
    os.makedirs(log_dir, exist_ok=True)
    return Sweep(device, tasks, jobs, timeout, max_samples, log_dir, progress).run()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="emu", help="SDK device name (emu, cudasdk, ...)")
    parser.add_argument("--dtypes", default=",".join(DTYPE_NAMES))
    parser.add_argument("--ops", help="only OpInfos whose full name matches this regular expression")
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help="sample-input layouts (sparse ones only for the OpInfos that support them)")
    parser.add_argument("--shard", help="I/N: every N-th OpInfo (sorted by name) starting at the I-th")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (each uses one thread)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds one pair may run")
    parser.add_argument("--max-samples", type=int, help="at most this many sample inputs per pair")
    parser.add_argument("--results", help="write every pair's result here (JSON lines)")
    parser.add_argument("--summary", help="write the summary here (JSON)")
    parser.add_argument("--log-dir", help="keep the workers' stderr here")
    parser.add_argument("--quiet", action="store_true", help="no per-pair progress lines")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        worker_main(args.device, args.result_fd, args.max_samples)
        return 0

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in dtypes if d not in DTYPE_NAMES]
    if unknown:
        parser.error(f"unknown dtype(s) {unknown}; expected a subset of {','.join(DTYPE_NAMES)}")
    shard = None
    if args.shard:
        match = re.fullmatch(r"(\d+)/(\d+)", args.shard)
        if not match or int(match.group(1)) >= int(match.group(2)):
            parser.error(f"--shard {args.shard!r}: expected I/N with 0 <= I < N")
        shard = (int(match.group(1)), int(match.group(2)))

    from opinfo_expected_failures import EXPECTED_FAILURES

    started = time.monotonic()
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if any(x not in LAYOUTS for x in layouts):
        parser.error(f"--layouts {args.layouts!r}: expected a subset of {','.join(LAYOUTS)}")
    tasks = enumerate_tasks(dtypes, args.ops, shard, layouts)
    if not tasks:
        parser.error("no (op, dtype) pair matches")
    results = run(args.device, tasks, args.jobs, args.timeout, args.max_samples, not args.quiet, args.log_dir)
    seconds = time.monotonic() - started
    summary, unexpected, passes = summarize(results, EXPECTED_FAILURES)
    modes = sorted({r.get("mode") for r in results if r.get("mode")})
    summary.update(device=args.device, seconds=round(seconds, 1), dtypes=dtypes, shard=args.shard, ops=args.ops,
                   fallback_mode=",".join(modes))
    if args.results:
        with open(args.results, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=2)
    print(format_table(summary, args.device, seconds))
    for r in unexpected:
        print(f"UNEXPECTED {r['status']}: {pair_name(r)} {r['dtype']} [{r.get('phase', '')}] "
              f"{r.get('detail', '')[:300]}")
    for r in passes:
        print(f"NOW PASSES (remove from the expected-failure list): {pair_name(r)} {r['dtype']}")
    return 0 if not unexpected and not passes else 1


if __name__ == "__main__":
    sys.exit(main())
