"""The `torchbridge` console script where a user's input or a user's Ctrl-C is unusual: each case
was found running the CLI by hand (2026-11-29) and compares with what the C++ binary does or the
docs (docs/cli-json.md) promise."""

import json
import os
import signal
import subprocess
import sys
import time

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "torchbridge")


def run(*args, **environment):
    return subprocess.run([CONSOLE_SCRIPT, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **environment})


def test_ctrl_c_stops_a_command_at_once_and_prints_no_result(tmp_path):
    # Python's SIGINT handler only set a flag, read when the C++ command returned: a long `train`
    # ran to its end, printed its whole JSON result, saved its file, and only then died.
    process = subprocess.Popen([CONSOLE_SCRIPT, "train", "--model", "builtin:mlp", "--steps", "100000", "--json",
                                "--save", str(tmp_path / "w.safetensors")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "TORCHBRIDGE_BACKEND": "cpu"},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3)  # inside the training loop
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=300)
    assert process.returncode == -signal.SIGINT
    assert out == b"" and not (tmp_path / "w.safetensors").exists()


def test_portability_refuses_an_output_directory_it_cannot_write_its_checkpoint_into(tmp_path):
    # Found only after the whole training: "out/transformer.safetensors: is a directory".
    (tmp_path / "transformer.safetensors").mkdir()
    result = run("portability", "--steps", "20", "--output", str(tmp_path))
    assert result.returncode == 1
    assert f"--output '{tmp_path}/transformer.safetensors' is a directory" in result.stderr, result.stderr
    assert "training" not in result.stdout.lower()


def test_a_value_typed_with_a_newline_is_shown_whole_in_the_error(tmp_path):
    # The error's first line only: "cannot read the configuration file 'c".
    result = run("info", "--config", str(tmp_path / "c\nd.json"))
    assert result.returncode == 1
    assert f"'{tmp_path}/c\\nd.json'" in result.stderr, result.stderr


def test_portability_reports_no_error_figure_for_a_backend_never_compared():
    # emu with 64 KiB cannot hold the model: its checks fail before measuring anything, and the
    # report said worst_output_rel_l2 0.0 ("Unknown values are null, never a made-up number").
    result = run("portability", "--steps", "20", "--isolate", "--json", TORCHBRIDGE_EMU_MEMORY="64K")
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads(result.stdout)
    emu = next(b for b in report["validation"]["backends"] if b["backend"] == "emu")
    assert emu["passed"] < emu["total"]
    assert emu["worst_output_rel_l2"] is None and emu["worst_gradient_rel_l2"] is None
    loads = [load for load in report["loads"] if load["backend"] == "emu"]
    assert loads and "out of memory" in loads[0]["error"], loads
