"""`torchbridge bench`: one run of every group on cpu and emu (--quick, a smoke run: no timing is
asserted, since timings are the machine's), checked for what the table promises: every case
measured against a baseline from the same run, the ratio their quotient, goals where the design
sets them, a progress line per case, and bad arguments refused before any work."""

import json
import os
import subprocess
import sys

import pytest

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def bench(*args):
    return subprocess.run([CONSOLE_SCRIPT, "bench", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TORCHBRIDGE_EMU_GUARDED": "1"})


@pytest.fixture(scope="module")
def quick_run():
    run = bench("--quick", "--json", "--backends", "cpu,emu")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout), run.stderr


def test_every_group_measures_against_a_baseline_of_the_same_run(quick_run):
    report, _ = quick_run
    assert report["schema"] == "torchbridge.bench/1"
    results = report["results"]
    by_group = {}
    for r in results:
        by_group.setdefault(r["group"], []).append(r)
        assert r["baseline"] > 0 and r["measured"] > 0, r
        assert r["ratio"] == pytest.approx(r["measured"] / r["baseline"], rel=1e-12)
        if r["goal"] is None:
            assert r["met"] is None
        else:
            assert r["met"] == (r["ratio"] >= r["goal"] if r["higher_is_better"] else r["ratio"] <= r["goal"])
    assert [r["case"] for r in by_group["sdk"]][:4] == [f"add, {n} elements" for n in (1, 10, 100, 1000)]
    assert {r["backend"] for r in by_group["sdk"]} == {"emu"}  # the CPU is the baseline, not a subject
    assert [r["goal"] for r in by_group["sdk"]] == [3.0] * 4 + [1.2, 0.8, 0.8, None, None]
    assert [r["unit"] for r in by_group["sdk"]] == ["us"] * 5 + ["GB/s"] * 4
    assert [(r["backend"], r["case"]) for r in by_group["checkpoint"]] == [
        ("cpu", "save 16 MiB (atomic, fsync)"), ("cpu", "load 16 MiB onto cpu"), ("emu", "load 16 MiB onto emu:0")]
    [validation] = by_group["validation"]
    assert validation["backend"] == "cpu+emu" and validation["goal"] == 3.0
    assert validation["note"].startswith("report valid")


def test_a_progress_line_per_case_with_elapsed_time(quick_run):
    _, stderr = quick_run
    lines = [line for line in stderr.splitlines() if line.startswith("[")]
    labels = [line.split("] ", 1)[1] for line in lines]
    assert labels == ([f"sdk emu: add, {n} elements" for n in (1, 10, 100, 1000)]
                      + ["sdk emu: matmul 256x256 fp32", "sdk emu: copies of 32 MiB", "checkpoint: save 16 MiB",
                         "checkpoint cpu: load 16 MiB", "checkpoint emu: load 16 MiB",
                         "validation cpu+emu: forward+backward", "validation cpu+emu: the validator"])
    elapsed = [float(line[1:].split(" s]")[0]) for line in lines]
    assert elapsed == sorted(elapsed)


def test_the_table_has_one_row_per_case():
    run = bench("--quick", "--backends", "cpu", "--groups", "checkpoint")
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("checkpoint ")]
    assert len(rows) == 2 and "write() + fsync" in rows[0] and "read() into tensors" in rows[1]
    assert "2 cases, 0 goal(s) not met" in run.stdout


@pytest.mark.parametrize("args,message", [
    (["--groups", "sdk,speed"], "--groups: 'speed' is not one of sdk, checkpoint, validation"),
    (["--backends", "cpu,,emu"], "--backends 'cpu,,emu' has an empty entry"),
    (["--backends", "cpu,"], "--backends 'cpu,' has an empty entry"),  # read as "cpu"
    (["--backends", "nosuch"], "nosuch"),
    (["--repeats", "3"], "--repeats"),
])
def test_bad_arguments_are_refused_before_any_work(args, message):
    run = bench(*args)
    assert run.returncode != 0
    assert message in run.stderr
    assert not [line for line in run.stderr.splitlines() if line.startswith("[")]


def test_sdk_group_without_a_device_says_it_skipped():
    run = bench("--quick", "--json", "--backends", "cpu", "--groups", "sdk")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["results"] == []
    assert "sdk: skipped, --backends names no device besides the CPU" in run.stderr
