"""The Python package's modules import each other in one direction: no module imports, at import
time, one that imports it back (checkpoint <-> _training_state did), and public modules do not
reach into another subpackage's private modules (validation used deployment._common). Checked on
the installed package's source, so a new cycle fails here rather than as a half-initialised
module in a user's program."""

import ast
import concurrent.futures
import importlib
import os
import pathlib
import subprocess
import sys

import torchbridge

PACKAGE = pathlib.Path(torchbridge.__file__).parent


def module_name(path: pathlib.Path) -> str:
    parts = ["torchbridge", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


def import_time_imports(path: pathlib.Path) -> "set[str]":
    """Modules of the package that `path` imports at module level (not inside functions)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("torchbridge")):
            if node.level > 0:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:  # `from X import m` imports module X.m when there is one
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("torchbridge"))
    found.discard(module_name(path))
    return {m for m in found if m in MODULES}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_no_import_cycles():
    graph = {name: import_time_imports(path) for name, path in MODULES.items()}

    # A module importing its own package (`from . import _C`) is how packages are built, not a
    # cycle between modules: the package is already initialising.
    def edges(name):
        return {t for t in graph[name] if not name.startswith(t + ".")}

    cycles = []
    state = {}

    def visit(name, stack):
        state[name] = "open"
        for target in sorted(edges(name)):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_reaches_into_another_subpackages_private_module():
    offenders = []
    for name, path in MODULES.items():
        for target in import_time_imports(path):
            parts = target.split(".")
            private = any(p.startswith("_") and p != "__init__" for p in parts[2:])
            if private and parts[1] != name.split(".")[1] and len(parts) > 2:
                offenders.append(f"{name} imports {target}")
    assert not offenders, offenders


def test_every_module_imports_first_in_a_fresh_interpreter():
    # A cycle shows up as an ImportError (or a missing name) only when the "wrong" module of it is
    # imported first; try each module first in its own interpreter.
    names = sorted(n for n in MODULES if not n.startswith("torchbridge.__main__"))
    program = "import importlib, sys\nimportlib.import_module(sys.argv[1])\n"

    def import_first(name):
        result = subprocess.run([sys.executable, "-c", program, name], capture_output=True, text=True, timeout=300)
        return None if result.returncode == 0 else f"{name}: {(result.stderr.strip().splitlines() or ['?'])[-1]}"

    # Each interpreter spends seconds importing torch: a few at once (64 in a row took 249 s on 2 cores).
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        failures = [failure for failure in pool.map(import_first, names) if failure]
    assert not failures, failures
    assert importlib.import_module("torchbridge.checkpoint").save_state is not None


def test_importing_torchbridge_leaves_torch_compile_unloaded():
    # torch._dynamo takes seconds to import (2.2 s of `import torchbridge` on the 2-core VM, through
    # fp8's torch.compiler.disable, before it was deferred): every program and every CLI run paid
    # it. Only code that compiles, or makes an FP8 layer, should.
    program = ("import sys, torchbridge, torchbridge.fp8, torchbridge.optimize\n"
               "print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._inductor'))))")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout

