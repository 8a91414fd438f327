"""The ``torchbridge`` console script: ``info`` and ``doctor`` run the same C++ code as
``build/bin/torchbridge``; ``run`` (redirection) needs Python and lives here."""

import os
import runpy
import sys
import traceback

from . import _C

_RUN_USAGE = """usage: torchbridge run SCRIPT [ARGS...]

Runs an unmodified Python program with redirection on: requests for an accelerator this machine
lacks (cuda, mps, xpu, ...) go to TORCHBRIDGE_BACKEND, or to the best available backend.
TORCHBRIDGE_LOG_LEVEL=INFO logs each redirected call site once. The script's exit code is kept.
"""


def _run(argv: "list[str]") -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_RUN_USAGE, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 1
    script = argv[0]
    if not os.path.isfile(script):
        print(f"torchbridge: run: script '{script}' does not exist", file=sys.stderr)
        return 1
    from . import redirect

    try:
        redirect.enable()
    except (ValueError, RuntimeError, IndexError) as error:
        print(f"torchbridge: run: {error}", file=sys.stderr)
        return 1
    sys.argv = [script] + list(argv[1:])
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_request:  # the script's own exit code is preserved
        code = exit_request.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - report exactly like Python would
        traceback.print_exc()
        return 1
    finally:
        redirect.disable()
    return 0


_PYTHON_COMMANDS = {"run": _run}


def main(argv: "list[str] | None" = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _PYTHON_COMMANDS:
        return _PYTHON_COMMANDS[argv[0]](argv[1:])
    sys.stdout.flush()
    return _C.run_cli(argv)


if __name__ == "__main__":
    sys.exit(main())
