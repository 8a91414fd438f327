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


def _export(argv: "list[str]") -> int:
    """``export --format onnx`` needs torch.onnx, so it runs here; the other formats run the
    same C++ code as the ``torchbridge`` binary."""
    options = _options(argv, ("--model", "--format", "--output", "--input-shape"))
    if options is None or options.get("--format") != "onnx":
        sys.stdout.flush()
        return _C.run_cli(["export"] + list(argv))
    try:
        import torch

        from .deployment import export_to_onnx
        from .validation import builtin_model

        for required in ("--model", "--output"):
            if required not in options:
                raise ValueError(f"export needs {required} (see --help)")
        spec = options["--model"]
        if spec.startswith("builtin:"):
            name = spec[len("builtin:"):]
            model = builtin_model(name)
            shape = options.get("--input-shape") or ",".join(map(str, _C.builtin_model_input_shape(name)))
        else:
            if not os.path.isfile(spec):
                raise ValueError(f"--model '{spec}' is neither builtin:NAME (mlp, cnn, transformer) nor an existing file")
            try:
                model = torch.jit.load(spec)
            except RuntimeError as error:
                raise ValueError(f"--model '{spec}' is not a TorchScript module torch can load: "
                                 f"{str(error).splitlines()[0]}") from None
            shape = options.get("--input-shape")
            if shape is None:
                raise ValueError("--format onnx verifies the file on a sample input: give --input-shape")
        sample = tuple(torch.randn(_C.parse_shape(s)) for s in shape.split(";"))
        result = export_to_onnx(model, output_path=options["--output"], sample_input=sample)
    except (ValueError, TypeError, ImportError, RuntimeError) as error:
        print(f"torchbridge: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"wrote {result} (onnx, {spec}), verified in onnxruntime: max abs error {result.max_abs_error:.3g}")
    return 0


def _options(argv: "list[str]", names) -> "dict[str, str] | None":
    """--name VALUE / --name=VALUE pairs; None when anything else (e.g. --help) is present, so
    the C++ parser reports it exactly as the binary does."""
    options, i = {}, 0
    while i < len(argv):
        name, _, value = argv[i].partition("=")
        if name not in names:
            return None
        if not value:
            if i + 1 >= len(argv):
                return None
            value, i = argv[i + 1], i + 1
        options[name] = value
        i += 1
    return options


_PYTHON_COMMANDS = {"run": _run, "export": _export}


def main(argv: "list[str] | None" = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _PYTHON_COMMANDS:
        return _PYTHON_COMMANDS[argv[0]](argv[1:])
    sys.stdout.flush()
    return _C.run_cli(argv)


if __name__ == "__main__":
    sys.exit(main())
