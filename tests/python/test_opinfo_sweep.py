"""The OpInfo sweep (opinfo_sweep.py) in CI: a fixed sample of PyTorch's OpInfo database on emu
against the CPU, plus the operators whose paths this glue has had to fix (math bits, FFTs, views,
sparse layouts), in both emu memory modes; and checks that the sweep itself catches what it is
meant to catch. The full sweep, with its figures in the README, is scripts/opinfo_sweep.sh."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import opinfo_sweep  # noqa: E402
from opinfo_expected_failures import EXPECTED_FAILURES  # noqa: E402

# Every 6th OpInfo (sorted by name) and the ones this glue has had to fix (math bits, FFTs, views,
# linear algebra on conjugate views, sparse layouts) or computes on a path of its own (the
# elementwise shortcut: add, sub, mul, div): about 2.5 minutes at 2 jobs.
SHARD = (0, 6)
FOCUS = (r"^(add|sub|mul|div|rsub|"
         r"fft\..*|conj|conj_physical|resolve_conj|resolve_neg|view_as_real|view_as_complex|unfold|"
         r"as_strided.*|mm|dot|vdot|istft|linalg\.householder_product|linalg\.lu_solve|linalg\.matrix_power|"
         r"to_sparse|sparse\..*|abs|bernoulli|empty_like|randn_like|tensor_split|nn\.functional\.dropout)$")
# The host-addressable path, on the operators whose math bits and layouts it once got wrong and
# the elementwise shortcut's.
FOCUS_IN_PLACE = (r"^(add|sub|mul|div|rsub|"
                  r"fft\.(hfft|ihfft|ifft)|conj_physical|resolve_conj|resolve_neg|view_as_real|unfold|mm|dot|vdot|"
                  r"linalg\.householder_product|linalg\.lu_solve|to_sparse|sparse\..*)$")


def _tasks(shard, pattern):
    tasks = opinfo_sweep.enumerate_tasks(shard=shard) + opinfo_sweep.enumerate_tasks(op_pattern=pattern)
    unique = {}
    for task in tasks:
        unique.setdefault((task["op"], task["dtype"], task["layout"]), task)
    return [dict(task, id=k) for k, task in enumerate(unique.values())]


def _assert_clean(results):
    summary, unexpected, passes = opinfo_sweep.summarize(results, EXPECTED_FAILURES)
    report = "\n".join(f"{r['status']}: {opinfo_sweep.pair_name(r)} {r['dtype']} {r.get('detail', '')[:300]}"
                       for r in unexpected)
    assert summary["crashes"] == 0 and summary["timeouts"] == 0, report
    assert not unexpected, report
    assert not passes, "expected failures that now pass (remove them from the list): " + ", ".join(
        f"{opinfo_sweep.pair_name(r)} {r['dtype']}" for r in passes)
    assert summary["applicable"] > 0 and summary["agreement_percent"] >= 99.0, summary
    return summary


def _run(tasks, env, max_samples=None):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return opinfo_sweep.run("emu", tasks, jobs=2, timeout=300, max_samples=max_samples)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_sampled_opinfo_sweep_agrees_with_the_cpu_guarded():
    summary = _assert_clean(_run(_tasks(SHARD, FOCUS), {"TORCHBRIDGE_EMU_GUARDED": "1"}))
    assert summary["backward_pairs"] > 100 and summary["sparse_layout_pairs"] > 10, summary


def test_focus_operators_agree_with_the_cpu_host_addressable():
    _assert_clean(_run(opinfo_sweep.enumerate_tasks(op_pattern=FOCUS_IN_PLACE), {"TORCHBRIDGE_EMU_GUARDED": "0"},
                       max_samples=24))


def test_a_crashing_operator_is_attributed_and_the_rest_still_run():
    tasks = opinfo_sweep.enumerate_tasks(dtype_names=("float32",), op_pattern=r"^(abs|acos|acosh)$",
                                         layouts=("strided",))
    results = _run(tasks, {"TORCHBRIDGE_OPINFO_SWEEP_CRASH_ON": "acos"})
    by_op = {r["op"]: r for r in results}
    assert by_op["acos"]["status"] == "crash" and "signal 11" in by_op["acos"]["detail"]
    assert by_op["abs"]["status"] == "agree" and by_op["acosh"]["status"] == "agree"


def test_the_comparison_catches_what_a_glue_defect_produces():
    import torch

    expected = torch.linspace(-3, 3, 64).reshape(8, 8)
    same = expected.clone()
    opinfo_sweep._compare(same, expected, "cpu", False, "values", "out")  # identical: no error
    # Beyond assert_close's float32 tolerance near zero, within 1e-5 of the largest magnitude (3):
    # accepted as rounding, and counted as such.
    rounded = expected + 2e-5
    rounding = [False]
    opinfo_sweep._compare(rounded, expected, "cpu", False, "values", "out", rounding)
    assert rounding[0]
    with pytest.raises(opinfo_sweep.Disagreement, match="of the largest magnitude"):
        opinfo_sweep._compare(expected + 1e-4, expected, "cpu", False, "values", "out")
    stale = expected.clone()
    stale[3, 5] = 0.0  # one element never written
    transposed = expected.t().contiguous().t()  # right values in another layout are fine...
    opinfo_sweep._compare(transposed, expected, "cpu", False, "values", "out")
    for wrong in (stale, expected.t(), expected.to(torch.float64), expected[:, :7], expected.to_sparse()):
        with pytest.raises(opinfo_sweep.Disagreement):
            opinfo_sweep._compare(wrong, expected, "cpu", False, "values", "out")
    # ...but a result left on the CPU by an operator that should produce a device tensor is not.
    with pytest.raises(opinfo_sweep.Disagreement, match="expected on the emu device"):
        opinfo_sweep._compare(same, expected, "emu", True, "values", "out")
    # Random operators: statistics, not values; a shifted distribution is caught.
    torch.manual_seed(0)
    a, b = torch.randn(4096), torch.randn(4096)
    opinfo_sweep._compare(a, b, "cpu", False, "statistics", "out")
    with pytest.raises(opinfo_sweep.Disagreement, match="mean"):
        opinfo_sweep._compare(a + 0.5, b, "cpu", False, "statistics", "out")
