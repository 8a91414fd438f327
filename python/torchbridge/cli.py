"""The ``torchbridge`` console script: ``info`` and ``doctor`` run the same C++ code as
``build/bin/torchbridge``; ``run`` (redirection) needs Python and lives here."""

import faulthandler
import importlib.util
import os
import runpy
import signal
import sys
import zipfile

from . import _C

_RUN_USAGE = """usage: torchbridge run SCRIPT [ARGS...]
       torchbridge run -m MODULE [ARGS...]

Runs an unmodified Python program (a script, or a module as `python -m` does) with redirection on. With TORCHBRIDGE_BACKEND set, every
accelerator request (cuda, mps, xpu, ...) goes to that backend, even on a machine that has the
requested one (TORCHBRIDGE_BACKEND=cpu on a CUDA machine runs on the CPU); without it, requests
for accelerators this machine lacks go to the best available backend.
TORCHBRIDGE_LOG_LEVEL=INFO logs each redirected call site once. The script's exit code is kept;
a script that fails exits non-zero with its error on stderr, and one that crashes (a signal)
prints the Python stack of every thread before the signal ends it.
Under torchrun, start each worker through it: torchrun --no-python ... torchbridge run SCRIPT.
"""


# What the program leaves behind (its globals; on an exception, the exception, whose traceback
# holds them), kept until the interpreter ends, as `python SCRIPT` keeps __main__'s. Freed while the
# interpreter still runs, torch can deadlock: a DistributedDataParallel's reducer destroyed on the
# main thread, which holds the GIL, joins Gloo's worker threads, one of which waits for the GIL to
# release the last collective's Python state (seen as a hang after the program's last line under
# torchrun). At interpreter exit those threads are not waited for.
_PROGRAM_STATE = []


def _report_uncaught(error: BaseException) -> None:
    """As Python reports an uncaught exception: through sys.excepthook (a program may set its own),
    and where that hook itself fails, both exceptions through the default hook."""
    try:
        sys.excepthook(type(error), error, error.__traceback__)
    except BaseException as hook_error:  # noqa: BLE001 - Python reports a failing hook the same way
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(type(error), error, error.__traceback__)


def _run(argv: "list[str]") -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_RUN_USAGE, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 1
    module = None
    if argv[0] == "-m":
        if len(argv) < 2 or not argv[1]:
            print("torchbridge: run: -m needs a module name (torchbridge run -m MODULE [ARGS...])", file=sys.stderr)
            return 1
        module, arguments = argv[1], list(argv[2:])
    else:
        script, arguments = argv[0], list(argv[1:])
        # As `python PATH`: a file, a zip archive, or a directory holding a __main__.py.
        if not os.path.isfile(script) and not os.path.isfile(os.path.join(script, "__main__.py")):
            print(f"torchbridge: run: script '{script}' does not exist"
                  + (" (a directory runs only with a __main__.py in it)" if os.path.isdir(script) else ""),
                  file=sys.stderr)
            return 1
    from . import redirect

    # A crash in native code (a segfault in a device library, an abort) would otherwise end the
    # program with no word on stderr; faulthandler prints every thread's Python stack first.
    if sys.stderr is not None:  # None when the shell closed it (2>&-), as for plain `python`
        faulthandler.enable(file=sys.stderr, all_threads=True)
    # Line by line, so what a program printed before a crash is not lost in a pipe's buffer.
    if sys.stdout is not None:
        sys.stdout.reconfigure(line_buffering=True)
    try:
        redirect.enable()
    except Exception as error:  # noqa: BLE001 - any failure to start is reported, never silent
        print(f"torchbridge: run: cannot enable redirection: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    try:
        if module is not None:
            # As `python -m`: the working directory first on sys.path, argv[0] the module's file.
            sys.argv = [module] + arguments
            sys.path.insert(0, os.getcwd())
            unrunnable = _why_not_runnable(module)
            if unrunnable is not None:
                print(f"torchbridge: run: {unrunnable}", file=sys.stderr)
                return 1
            _PROGRAM_STATE.append(runpy.run_module(module, run_name="__main__", alter_sys=True))
        else:
            sys.argv = [script] + arguments
            # As `python PATH`, for the whole process: a file's directory first on sys.path, or the
            # directory or zip archive itself (runpy puts that there too, but takes it away when the
            # body returns, while the program's threads and atexit handlers may still import from it).
            # __file__ is absolute, as Python (3.9+) makes a main script's.
            runs_whole = os.path.isfile(script) and not zipfile.is_zipfile(script)
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)) if runs_whole else os.path.abspath(script))
            _PROGRAM_STATE.append(runpy.run_path(os.path.abspath(script), run_name="__main__"))
    except SystemExit as exit_request:  # the script's own exit code is preserved
        _PROGRAM_STATE.append(exit_request)
        code = exit_request.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException as error:  # noqa: BLE001 - report exactly like Python would
        _PROGRAM_STATE.append(error)
        _report_uncaught(error)
        # An interrupted program exits with the shell's status for SIGINT, as Python's does.
        return 128 + signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    finally:
        # Redirection stays on until the interpreter ends, as the program's objects do: its
        # threads still run, and its atexit handlers still call torch.cuda, after this returns.
        # What the script printed reaches the terminal or pipe now, even if native code crashes
        # while the interpreter shuts down.
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None when the shell closed it, as for plain `python`
                stream.flush()
    return 0


def _why_not_runnable(module: str) -> "str | None":
    """Why ``python -m MODULE`` would not start, in the one line it prints then, or None when it
    finds the module. Parent packages are imported to look (as runpy does); the module is not."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as error:  # a parent package missing or failing; a relative name
        return f"Error while finding module specification for {module!r} ({type(error).__name__}: {error})"
    if spec is None:
        return f"No module named {module}"
    if spec.submodule_search_locations is not None and _why_not_runnable(module + ".__main__") is not None:
        return f"No module named {module}.__main__; {module!r} is a package and cannot be directly executed"
    return None


# Formats that need torch.onnx or torch.export, so they run here: (exporter, what verified them).
_PYTHON_EXPORTS = {
    "onnx": ("export_to_onnx", "verified in onnxruntime"),
    "exported": ("export_to_exported_program", "verified by torch.export.load"),
    "aoti": ("export_to_aoti", "verified by aoti_load_package"),
}


def _export(argv: "list[str]") -> int:
    """``export --format onnx|exported|aoti`` need torch.onnx / torch.export, so they run here;
    the other formats run the same C++ code as the ``torchbridge`` binary."""
    options = _options(argv, ("--model", "--format", "--output", "--input-shape"))
    if options is None or options.get("--format") not in _PYTHON_EXPORTS:
        _flush_stdout()
        return _run_cli(["export"] + list(argv))
    export_format = options["--format"]
    exporter_name, verified_by = _PYTHON_EXPORTS[export_format]
    try:
        import torch

        from . import deployment
        from .validation import builtin_model

        for required in ("--model", "--output"):
            if required not in options:
                raise ValueError(f"export needs {required} (see --help)")
        if not options["--output"]:  # the exporter's own error named its parameter, output_path
            raise ValueError("--output is empty; expected the path of the file to write")
        spec = options["--model"]
        if spec.startswith("builtin:"):
            name = spec[len("builtin:"):]
            model = builtin_model(name)
            shape = options.get("--input-shape") or ",".join(map(str, _C.builtin_model_input_shape(name)))
        else:
            if not os.path.isfile(spec):
                raise ValueError(f"--model '{spec}' is neither builtin:NAME (mlp, cnn, transformer) nor an existing file")
            if os.path.exists(options["--output"]) and os.path.samefile(spec, options["--output"]):
                raise ValueError(f"--output '{options['--output']}' is the --model file itself; write the export to "
                                 "another path")
            try:
                model = torch.jit.load(spec)
            except RuntimeError as error:
                raise ValueError(f"--model '{spec}' is not a TorchScript module torch can load: {error}") from None
            shape = options.get("--input-shape")
            if shape is None:
                raise ValueError(f"--format {export_format} verifies the file on a sample input: give --input-shape")
        sample = tuple(torch.randn(_C.parse_shape(s)) for s in shape.split(";"))
        result = getattr(deployment, exporter_name)(model, output_path=options["--output"], sample_input=sample)
    except (ValueError, TypeError, ImportError, RuntimeError) as error:
        # The whole message: a TorchScript model's failure names the cause in its last lines.
        print(f"torchbridge: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # writing the output (reading --model fails in torch.jit.load as a RuntimeError)
        print(f"torchbridge: cannot write --output '{options['--output']}': {error.strerror or error}",
              file=sys.stderr)
        return 1
    print(f"wrote {result} ({export_format}, {spec}), {verified_by}: max abs error {result.max_abs_error:.3g}")
    return 0


def _options(argv: "list[str]", names) -> "dict[str, str] | None":
    """--name VALUE / --name=VALUE pairs; None when anything else (e.g. --help, or an option given
    twice) is present, so the C++ parser reports it exactly as the binary does."""
    options, i = {}, 0
    while i < len(argv):
        name, _, value = argv[i].partition("=")
        if name not in names or name in options:
            return None
        if not value:
            if i + 1 >= len(argv):
                return None
            value, i = argv[i + 1], i + 1
        options[name] = value
        i += 1
    return options


_PYTHON_COMMANDS = {"run": _run, "export": _export}
# How the C++ commands start this tool again for work in a child process (see cli/child_process.h).
_SELF_COMMAND = [sys.executable, "-m", "torchbridge.cli"]


def _flush_stdout() -> None:
    """What Python printed goes out before the C++ command writes to the same descriptor. With
    standard output closed (>&-) sys.stdout is None, and flushing it raised AttributeError; the
    command then finds the descriptor closed and says so itself."""
    if sys.stdout is not None:
        sys.stdout.flush()


def _run_cli(argv: "list[str]") -> int:
    # As bytes: an argument that is not UTF-8 (a file name) reaches Python as a str with surrogate
    # escapes, which the binding could not turn into a C++ string (a TypeError, not a run).
    return _C.run_cli([os.fsencode(argument) for argument in argv], _SELF_COMMAND)


def main(argv: "list[str] | None" = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _PYTHON_COMMANDS:
        return _PYTHON_COMMANDS[argv[0]](argv[1:])
    _flush_stdout()
    return _run_cli(argv)


if __name__ == "__main__":
    sys.exit(main())
