"""The ``torchbridge`` console script: ``info`` and ``doctor`` run the same C++ code as
``build/bin/torchbridge``; commands that need Python live here."""

import sys

from . import _C

_PYTHON_COMMANDS = {}  # name -> function(argv) -> exit code; `run` (redirection) is not built yet


def main(argv: "list[str] | None" = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _PYTHON_COMMANDS:
        return _PYTHON_COMMANDS[argv[0]](argv[1:])
    if argv and argv[0] == "run":
        print("torchbridge: 'run' (redirection of CUDA programs) is not available in this version yet",
              file=sys.stderr)
        return 1
    sys.stdout.flush()
    return _C.run_cli(argv)


if __name__ == "__main__":
    sys.exit(main())
