"""Issue 20's reproduction from Python: conjugate and negative views, FFTs and complex autograd on an
SDK device used to recurse until the process died (the conjugate fallback resolved a view by
clone(), whose copy_ reached _copy_from with the bit still set). The cases run in a fresh
interpreter per emu memory mode, so a crash fails the test naming its case instead of killing
pytest."""

import textwrap

import pytest

CASES = {
    "issue_reproduction": """
        y = torch.randn(5, 6, 7, dtype=torch.complex64)
        d = y.to("emu")
        check(d.conj().resolve_conj(), y.conj().resolve_conj())
        host = d.conj().cpu()
        assert host.device.type == "cpu"
        torch.testing.assert_close(host.resolve_conj(), y.conj().resolve_conj(), rtol=0, atol=0)
        check(d.conj().clone(), y.conj())
    """,
    "negative_views": """
        y = torch.randn(5, 6, 7, dtype=torch.complex64)
        d = y.to("emu")
        check(torch._neg_view(d).resolve_neg(), -y)
        check(d.conj().imag, -y.imag)
        check(d.conj().imag.clone(), -y.imag)
        target = torch.zeros_like(d)
        target.conj().copy_(d)
        check(target, y.conj())
    """,
    "ffts_forward": """
        y = torch.randn(5, 6, 7, dtype=torch.complex64)
        r = torch.randn(5, 6, 7)
        for name in ("fft", "ifft", "hfft", "hfft2", "hfftn", "irfft", "fftn"):
            check(getattr(torch.fft, name)(y.to("emu")), getattr(torch.fft, name)(y), tol=1e-5)
        for name in ("ihfft", "ihfft2", "ihfftn", "rfft"):
            check(getattr(torch.fft, name)(r.to("emu")), getattr(torch.fft, name)(r), tol=1e-5)
    """,
    "complex_autograd": """
        y = torch.randn(5, 6, 7, dtype=torch.complex64)
        def grad(device):
            leaf = y.to(device).requires_grad_()
            out = torch.fft.hfft(leaf * leaf.conj() + torch.fft.ifft(leaf)).abs().sum()
            return torch.autograd.grad(out, leaf)[0]
        check(grad("emu"), grad("cpu"), tol=1e-5)
    """,
}

PRELUDE = """
import torch, torchbridge
torchbridge.devices.load("emu")
torch.manual_seed(0)
def check(actual, expected, tol=0.0):
    assert actual.device.type == "emu", actual.device
    torch.testing.assert_close(actual.cpu().resolve_conj().resolve_neg(), expected.resolve_conj().resolve_neg(),
                               rtol=tol, atol=tol)
"""


def _program():
    """All cases in one interpreter, each reporting itself, so a crash names the case it hit."""
    body = [PRELUDE]
    for name in sorted(CASES):
        body.append(f"print('start {name}', flush=True)")
        body.append(textwrap.dedent(CASES[name]).strip())
        body.append(f"print('done {name}', flush=True)")
    return "\n".join(body)


@pytest.mark.parametrize("guarded", ["1", "0"], ids=["guarded", "host_addressable"])
def test_math_bit_views_and_ffts_match_the_cpu(fresh_python, guarded):
    result = fresh_python(_program(), env={"TORCHBRIDGE_EMU_GUARDED": guarded})
    done = {line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("done ")}
    started = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("start ")]
    failing = started[-1] if started and started[-1] not in done else None
    assert result.returncode == 0 and done == set(CASES), (
        f"exit {result.returncode}; case {failing!r} did not finish\n{result.stderr[-3000:]}")
