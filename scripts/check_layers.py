#!/usr/bin/env python3
"""TorchBridge's layers and the only directions they may depend in, checked on every build.

Each source and header belongs to one layer (by its directory). A file may include headers of its
own layer and of the layers listed as below it, nothing else: an include against the direction
fails the build (CMake runs this before compiling the library), naming the file, the line and
what it may use instead. `--objects DIR` checks the same order at link level after the library is
built: no layer's object files may use a symbol that only a layer above defines (a declaration in
a low header implemented higher up, which no include check can see). `--graph` prints the layers and the dependencies the code really has,
as a Mermaid graph (docs/architecture.md shows it); `--check-doc FILE` fails when the graph in
FILE is not that one, naming the arrows it lacks and those the code no longer has.

    scripts/check_layers.py [--graph] [--check-doc docs/architecture.md] [--stamp FILE]
                            [--objects CMakeFiles/torchbridge.dir]
"""

import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Lowest first. Each layer lists the layers it may include (itself always allowed).
LAYERS = {
    "sdk-abi": [],  # the C interface vendors implement (runtime.h) and its header-only helpers
    "core": [],
    "backends": ["core"],
    "sdk": ["sdk-abi", "core", "backends"],
    # Mixed precision for C++ programs: autocast scopes, loss scaling, FP8 layers.
    "amp": ["core", "backends"],
    # Portable checkpoints; a training state carries a GradScaler's state (amp's plain struct).
    "checkpoint": ["core", "backends", "amp"],
    # What one call does to a model for the hardware there: configuration, optimization levels.
    "optimize": ["core", "backends", "amp"],
    # Memory for training: activation checkpointing (its recomputation runs under the region's
    # autocast), optimizer-state offload.
    "memory": ["core", "backends", "amp"],
    "validation": ["core", "backends", "checkpoint", "memory"],
    # Distributed training over c10d: process groups from torchrun's contract.
    "distributed": ["core", "backends"],
    "cli": ["core", "backends", "sdk", "checkpoint", "validation", "amp", "optimize", "memory", "distributed"],
    # The Python package hosts the CLI (its `torchbridge` command runs cli::run_cli in-process);
    # everything else it uses comes from the library layers.
    "python": ["core", "backends", "sdk", "checkpoint", "validation", "amp", "optimize", "memory", "distributed",
               "cli"],
    "devices": ["sdk-abi"],
    "umbrella": ["core", "backends", "sdk", "checkpoint", "validation", "amp", "optimize", "memory"],
}

# Public headers (include/torchbridge/) by the layer that implements them.
PUBLIC = {
    "sdk/runtime.h": "sdk-abi",
    "sdk/exception_barrier.h": "sdk-abi",
    "sdk/": "sdk",
    "checkpoint/": "checkpoint",
    "validation/": "validation",
    "amp/": "amp",
    "optimize/": "optimize",
    "memory/": "memory",
    "distributed/": "distributed",
    "privateuse1.h": "backends",
    "process_isolation.h": "backends",
    "redirect.h": "backends",
    "torchbridge.h": "umbrella",
    "": "core",  # every other top-level header
}

SOURCE_DIRS = {
    "src/core": "core",
    "src/backends": "backends",
    "src/sdk": "sdk",
    "src/checkpoint": "checkpoint",
    "src/validation": "validation",
    "src/amp": "amp",
    "src/optimize": "optimize",
    "src/memory": "memory",
    "src/distributed": "distributed",
    "cli": "cli",
    "python/src": "python",
    "devices": "devices",
    "examples/minimal_device": "devices",  # a device like the others, in C
}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def layer_of_public(name: str) -> str:
    for prefix, layer in PUBLIC.items():
        if prefix and (name == prefix or (prefix.endswith("/") and name.startswith(prefix))):
            return layer
    return PUBLIC[""]


def layer_of_file(path: pathlib.Path):
    rel = path.relative_to(ROOT).as_posix()
    if rel.startswith("include/torchbridge/"):
        return layer_of_public(rel[len("include/torchbridge/"):])
    for prefix, layer in SOURCE_DIRS.items():
        if rel.startswith(prefix + "/"):
            return layer
    return None


def layer_of_include(name: str, including: pathlib.Path):
    """The layer of an included header of ours, or None for system and third-party headers."""
    if name.startswith("torchbridge/"):
        return layer_of_public(name[len("torchbridge/"):])
    for base in (including.parent, ROOT / "src", ROOT / "cli"):
        candidate = base / name
        if candidate.is_file():
            return layer_of_file(candidate.resolve())
    return None


def project_files():
    for directory in ["include/torchbridge", *SOURCE_DIRS]:
        for path in sorted((ROOT / directory).rglob("*")):
            if path.suffix in (".h", ".c", ".cpp", ".cu") and path.is_file():
                yield path


def object_symbols(path: pathlib.Path):
    """(strong global definitions, undefined references) of one object file."""
    # Mangled names (no spaces), demangled only for messages.
    out = subprocess.run(["nm", "-P", str(path)], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBR":
            defined.add(name)
    return defined, undefined


def check_objects(directory: pathlib.Path):
    """Link-level violations: a layer's objects using what only a disallowed layer defines."""
    layer_dirs = {"core": "core", "backends": "backends", "sdk": "sdk", "checkpoint": "checkpoint",
                  "validation": "validation", "amp": "amp", "optimize": "optimize",
                  "memory": "memory"}
    definitions, uses = {}, {}
    for layer, sub in layer_dirs.items():
        for obj in sorted((directory / sub).glob("*.o")):
            if not (ROOT / "src" / sub / obj.name[: -len(".o")]).is_file():
                continue  # left behind by a source that moved or went away
            defined, undefined = object_symbols(obj)
            for name in defined:
                definitions.setdefault(name, layer)
            uses[obj] = (layer, undefined)
    def demangled(name):
        return subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip() or name

    violations = []
    for obj, (layer, undefined) in uses.items():
        for name in sorted(undefined):
            owner = definitions.get(name)
            if owner and owner != layer and owner not in LAYERS[layer]:
                violations.append(f"{obj.name}: layer '{layer}' uses {demangled(name)}, defined in layer '{owner}'; "
                                  f"'{layer}' may use: {', '.join(LAYERS[layer]) or 'nothing but itself'}")
    return violations


def graph_lines(edges):
    """The Mermaid graph of `edges` ((layer, layer it includes) pairs), one line per arrow."""
    return ["graph BT"] + [f"  {source.replace('-', '_')}[{source}] --> {target.replace('-', '_')}[{target}]"
                          for source, target in sorted(edges)]


def documented_graph_differences(document: pathlib.Path, real: list):
    """What the first `graph BT` block of `document` lacks of `real` and has beyond it, as messages."""
    try:
        lines = document.read_text().splitlines()
    except OSError as e:
        return [f"{document}: cannot read the document with the layer graph: {e.strerror}"]
    if "graph BT" not in lines:
        return [f"{document}: no Mermaid block starting with 'graph BT'; expected the layer graph "
                f"(scripts/check_layers.py --graph)"]
    start = lines.index("graph BT")
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("```")), len(lines))
    documented = {line for line in lines[start:end] if line.strip()}
    return ([f"{document}: the layer graph lacks '{line.strip()}', which the code has" for line in real
             if line not in documented] +
            [f"{document}: the layer graph has '{line.strip()}', which the code no longer has"
             for line in sorted(documented - set(real))])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graph", action="store_true", help="print the real dependencies as a Mermaid graph")
    parser.add_argument("--check-doc", metavar="FILE", help="fail unless FILE shows the real dependency graph")
    parser.add_argument("--stamp", help="touch this file when the check passes (for the build)")
    parser.add_argument("--objects", help="the library's object directory: check symbols instead of includes")
    args = parser.parse_args()

    if args.objects:
        violations = check_objects(pathlib.Path(args.objects))
        for v in violations:
            print(v, file=sys.stderr)
        if violations:
            print(f"check_layers: {len(violations)} symbol use(s) against the layer order", file=sys.stderr)
        return 1 if violations else 0

    violations, edges = [], set()
    for path in project_files():
        layer = layer_of_file(path)
        if layer is None:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = layer_of_include(match.group(1), path)
            if target is None or target == layer:
                continue
            edges.add((layer, target))
            if target not in LAYERS[layer]:
                allowed = ", ".join(LAYERS[layer]) or "nothing but itself"
                violations.append(f"{path.relative_to(ROOT)}:{number}: layer '{layer}' includes "
                                  f"{match.group(1)} of layer '{target}'; '{layer}' may use: {allowed}")

    if args.graph:
        print("\n".join(graph_lines(edges)))
    differences = documented_graph_differences(pathlib.Path(args.check_doc), graph_lines(edges)) \
        if args.check_doc else []
    for d in differences:
        print(d, file=sys.stderr)
    if differences:
        print("check_layers: print the graph with scripts/check_layers.py --graph and replace the document's "
              "block with it", file=sys.stderr)
    for v in violations:
        print(v, file=sys.stderr)
    if violations:
        print(f"check_layers: {len(violations)} include(s) against the layer order (scripts/check_layers.py "
              "lists the layers; docs/architecture.md explains them)", file=sys.stderr)
        return 1
    if differences:
        return 1
    if args.stamp:
        pathlib.Path(args.stamp).touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
