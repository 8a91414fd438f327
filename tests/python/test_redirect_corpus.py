"""Every program in tests/redirect/ (written for CUDA) runs unmodified under `torchbridge run` with
the target `cpu` and with the target `emu`. The cpu run computes everything directly on the CPU;
the emu run must print the same. Lines starting with `info:` (timings, memory figures) differ by
target and are not compared. Lines must match exactly, except that numbers in fp16-autocast
output may differ by a relative 1e-3: the CPU target uses PyTorch's CPU autocast lists, emu the
CUDA lists, so a few operators run in different precisions."""

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


def run(program: str, target: str) -> "list[str]":
    env = dict(os.environ, TORCHBRIDGE_BACKEND=target)
    result = subprocess.run([CONSOLE_SCRIPT, "run", program], cwd=CORPUS, capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, f"{program} on {target} failed:\n{result.stderr[-3000:]}"
    return [line for line in result.stdout.splitlines() if line and not line.startswith("info:")]


def same_within(expected: str, actual: str, rel: float) -> bool:
    if NUMBER.sub("#", expected) != NUMBER.sub("#", actual):
        return False
    return all(float(a) == pytest.approx(float(e), rel=rel, abs=1e-9)
               for e, a in zip(NUMBER.findall(expected), NUMBER.findall(actual)))


def test_corpus_has_the_programs_the_issue_lists():
    assert {"train_loop.py", "amp_gradscaler.py", "event_timing.py", "memory_stats.py", "two_streams.py",
            "dataloader_pinned.py", "compiled_function.py", "distributions.py", "set_device_one.py"} <= set(PROGRAMS)


@pytest.mark.parametrize("program", PROGRAMS)
def test_program_prints_the_same_on_emu_as_on_the_cpu(program):
    on_cpu, on_emu = run(program, "cpu"), run(program, "emu")
    assert on_cpu, f"{program} printed nothing to compare"
    assert len(on_cpu) == len(on_emu), (on_cpu, on_emu)
    for expected, actual in zip(on_cpu, on_emu):
        if program in REDUCED_PRECISION:
            assert same_within(expected, actual, rel=1e-3), (expected, actual)
        else:
            assert actual == expected
    for line in on_cpu:  # the programs' own checks must hold on both targets
        assert not line.endswith(": False"), line
