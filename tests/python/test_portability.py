"""`torchbridge portability`, the README's main job, in both of its process layouts: every backend
in one process (a CPU machine), and the SDK device checked in a child process (what a CUDA
machine does, forced here with --isolate)."""

import json
import os
import subprocess
import sys

import pytest

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def native_accelerators():
    """What `portability` also runs on besides the CPU and emu, from torch itself: a GPU machine's
    accelerator (and there emu always gets a process of its own, one accelerator per process)."""
    import torch

    found = set()
    if torch.cuda.is_available():
        found.add("rocm" if torch.version.hip else "cuda")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        found.add("xpu")
    if torch.backends.mps.is_available():
        found.add("mps")
    return found


def portability(*args):
    return subprocess.run([CONSOLE_SCRIPT, "portability", "--steps", "40", "--json", *args], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("isolate", [False, True])
def test_trains_saves_reloads_and_validates_everywhere(isolate, tmp_path):
    run = portability("--output", str(tmp_path), *(["--isolate"] if isolate else []))
    assert run.returncode == 0, run.stderr + run.stdout
    report = json.loads(run.stdout)
    assert report["passed"]
    assert report["training"]["last_loss"] < report["training"]["first_loss"]
    loads = {load["backend"]: load for load in report["loads"]}
    assert set(loads) == {"cpu", "emu"} | native_accelerators()
    assert all(load["passed"] and load["step"] == 40 for load in loads.values())
    hardware = {entry["backend"]: entry for entry in report["hardware"]}
    own_process = isolate or bool(native_accelerators())
    assert hardware["emu"]["available"] and hardware["emu"].get("own_process", False) == own_process
    # emu's devices are alike: one entry "N x name", the name once (it was printed twice before)
    assert len(hardware["emu"]["devices"]) == 1
    assert hardware["emu"]["devices"][0].count("TorchBridge emulated accelerator") == 1
    validated = {b["backend"]: b for b in report["validation"]["backends"]}
    assert set(validated) == {"cpu", "emu"} | native_accelerators()
    assert all(b["passed"] == b["total"] > 0 for b in validated.values())
    assert os.path.exists(report["checkpoint"]["path"])


def test_a_failing_child_fails_the_run_and_says_why(tmp_path):
    run = subprocess.run([CONSOLE_SCRIPT, "portability", "--steps", "20", "--isolate", "--output", str(tmp_path)],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, TORCHBRIDGE_EMU_DEVICES="many"))
    assert run.returncode == 1
    assert "NOT PORTABLE" in run.stdout
    assert "TORCHBRIDGE_EMU_DEVICES" in run.stdout


@pytest.mark.parametrize("args, message", [
    (["--steps", "5"], "--steps '5' is not a whole number from 20 to 100000"),
    (["--backends", "emu"], "belong to --check-checkpoint"),
    (["--check-checkpoint", "x.safetensors"], "needs --reference-outputs FILE and --backends LIST"),
])
def test_bad_input_exits_1(args, message):
    run = subprocess.run([CONSOLE_SCRIPT, "portability", *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert message in run.stderr


def test_a_temporary_directory_that_cannot_be_made_stops_the_run_before_it_trains(tmp_path):
    missing = tmp_path / "missing"
    run = subprocess.run([CONSOLE_SCRIPT, "portability", "--steps", "20"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, TMPDIR=str(missing)))
    assert run.returncode == 1
    assert f"cannot create a temporary directory in {missing} (TMPDIR): No such file or directory" in run.stderr
    assert run.stdout == ""  # nothing trained, nothing reported


def test_without_output_the_run_leaves_nothing_behind(tmp_path):
    # The checkpoint and the child's reference outputs went to a temporary directory that stayed
    # (0.5 MB a run); the child process (--isolate) must still find them while the run lasts.
    run = subprocess.run([CONSOLE_SCRIPT, "portability", "--steps", "20", "--isolate", "--json"], capture_output=True,
                         text=True, timeout=600, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert run.returncode == 0, run.stderr + run.stdout
    report = json.loads(run.stdout)
    assert report["passed"] and report["checkpoint"]["path"] is None and report["checkpoint"]["bytes"] > 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("output, message", [
    ("a-file/sub", "cannot create the directory: Not a directory"),
    ("/proc/self", "cannot write in the directory"),
])
def test_an_output_that_cannot_take_the_checkpoint_stops_the_run_before_it_trains(tmp_path, output, message):
    (tmp_path / "a-file").write_text("")
    run = subprocess.run([CONSOLE_SCRIPT, "portability", "--steps", "20", "--output", output], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 1
    assert f"--output '{output}': {message}" in run.stderr
    assert run.stdout == ""  # nothing trained, nothing reported


def test_checkpointed_training_is_portable_too(tmp_path):
    # --isolate: the emu child must train and validate through checkpointing as well (the merge
    # refuses a part that did not).
    run = portability("--output", str(tmp_path), "--checkpointing", "--isolate")
    assert run.returncode == 0, run.stderr + run.stdout
    report = json.loads(run.stdout)
    assert report["passed"]
    assert report["training"]["checkpointing"] is True
    assert report["training"]["last_loss"] < report["training"]["first_loss"]
    assert report["validation"]["checkpointing"] is True
    validated = {b["backend"]: b for b in report["validation"]["backends"]}
    assert set(validated) == {"cpu", "emu"} | native_accelerators() and all(b["passed"] == b["total"] > 0 for b in validated.values())
