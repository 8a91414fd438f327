import subprocess
import sys

import pytest


def run_python(code: str, env: "dict | None" = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (device loading is once per process). faulthandler prints
    the Python stack if the child dies of a signal, so a crash names the line that hit it."""
    import os

    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=timeout)


@pytest.fixture
def fresh_python():
    return run_python
