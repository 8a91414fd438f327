"""Every program in tests/redirect/ (written for CUDA) runs unmodified under `torchbridge run` with
the target `cpu` and with every other target in TORCHBRIDGE_REDIRECT_TARGETS (default `cpu,emu`;
scripts/gpu-check.sh adds `cuda` and `cudasdk`). The cpu run computes everything directly on the
CPU; every other target must print the same. Lines starting with `info:` (timings, memory figures)
differ by target and are not compared. Lines must match exactly on targets whose kernels are the
CPU's (SDK devices), except that numbers in fp16-autocast output may differ by a relative 1e-3:
the CPU target uses PyTorch's CPU autocast lists, the others the CUDA lists, so a few operators
run in different precisions. A GPU computes with its own kernels, so numbers there agree within
a relative 1e-3 (fp32) or 2e-2 (fp16 autocast), and its random numbers are its own."""

import functools
import os
import re
import subprocess
import sys

import pytest

CORPUS = os.path.join(os.path.dirname(__file__), "..", "redirect")
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")
PROGRAMS = sorted(f for f in os.listdir(CORPUS) if f.endswith(".py"))
REDUCED_PRECISION = {"amp_gradscaler.py"}
NUMBER = re.compile(r"-?\d+\.?\d*(?:e[-+]?\d+)?")


TARGETS = [t for t in os.environ.get("TORCHBRIDGE_REDIRECT_TARGETS", "cpu,emu").split(",") if t and t != "cpu"]
GPU_KERNELS = {"cuda", "nvidia", "rocm", "amd", "hip"}  # targets that compute with their own kernels
# Programs that draw random numbers on the device: a GPU's generator (Philox) is not the CPU's, so
# on a GPU only what they print is compared, not the values. (SDK devices draw from the CPU's.)
RANDOM_ON_DEVICE = {"distributions.py"}


@functools.lru_cache(maxsize=None)
def run(program: str, target: str) -> "tuple[str, ...]":
    env = dict(os.environ, TORCHBRIDGE_BACKEND=target)
    result = subprocess.run([CONSOLE_SCRIPT, "run", program], cwd=CORPUS, capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, f"{program} on {target} failed:\n{result.stderr[-3000:]}"
    lines = tuple(line for line in result.stdout.splitlines() if line and not line.startswith("info:"))
    assert lines, f"{program} on {target} printed nothing to compare (stderr: {result.stderr[-2000:]})"
    return lines


def same_within(expected: str, actual: str, rel: float) -> bool:
    if NUMBER.sub("#", expected) != NUMBER.sub("#", actual):
        return False
    return all(float(a) == pytest.approx(float(e), rel=rel, abs=1e-9)
               for e, a in zip(NUMBER.findall(expected), NUMBER.findall(actual)))


def test_corpus_has_the_programs_the_issue_lists():
    assert {"train_loop.py", "amp_gradscaler.py", "event_timing.py", "memory_stats.py", "two_streams.py",
            "dataloader_pinned.py", "compiled_function.py", "distributions.py", "set_device_one.py"} <= set(PROGRAMS)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("program", PROGRAMS)
def test_program_prints_the_same_as_on_the_cpu(program, target):
    on_cpu, on_target = run(program, "cpu"), run(program, target)
    assert len(on_cpu) == len(on_target), (on_cpu, on_target)
    gpu = target in GPU_KERNELS
    for expected, actual in zip(on_cpu, on_target):
        if gpu and program in RANDOM_ON_DEVICE:
            assert expected.split(":")[0] == actual.split(":")[0], (expected, actual)
        elif program in REDUCED_PRECISION:
            assert same_within(expected, actual, rel=2e-2 if gpu else 1e-3), (expected, actual)
        elif gpu:
            assert same_within(expected, actual, rel=1e-3), (expected, actual)
        else:
            assert actual == expected
    for line in on_cpu + on_target:  # the programs' own checks must hold on every target
        assert not line.endswith(": False"), line
