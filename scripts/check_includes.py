#!/usr/bin/env python3
"""Include hygiene and clang warnings for the project's own C++ code.

Every translation unit in build/compile_commands.json that belongs to this project is parsed by
include-what-you-use (a clang front end) without the precompiled header the build force-includes,
with -Wall -Wextra -Werror. It fails when
  - clang reports an error or a warning in our code (the build itself uses GCC), or
  - IWYU says one of our files must add a C++ standard-library header: such a file compiles
    only because another header includes that one transitively, which changes between standard
    library releases (GCC 13's libstdc++ dropped <cstdint> from <string>, breaking the build).
Suggestions about torch's own headers are not enforced: torch's internal header layout is not a
stable interface, and its umbrella headers are the documented way in.

usage: check_includes.py BUILD_DIR [--jobs N]
"""

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT_DIRS = ("src", "cli", "devices", "examples", "python/src", "tests", "bench", "fuzz", "include")
# Files IWYU may report on: ours, not torch's, gtest's or the build tree's generated ones.
CHECK_ALSO = [f"{ROOT}/{d}/*" for d in PROJECT_DIRS]
STD_HEADER = re.compile(r"^#include <([a-z_0-9]+)>")  # <cstdint>, <string>, ... (no .h, no path)
# Headers IWYU asks for that come with the language constructs or library types that need them
# (a braced list, <=>, std::chrono's ratios, a std::tuple that a torch function returns): asking
# for them is IWYU's pedantry, not a portability risk.
NOT_ENFORCED = {"initializer_list", "compare", "ratio", "type_traits", "iosfwd", "system_error", "tuple",
                "string_view"}


def ours(path: str) -> bool:
    rel = os.path.relpath(path, ROOT)
    return not rel.startswith("..") and rel.split(os.sep)[0] in {d.split("/")[0] for d in PROJECT_DIRS}


def iwyu_command(entry) -> "list[str]":
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip = ["include-what-you-use"], False
    for arg in args[1:]:
        if skip:
            skip = False
            continue
        if arg in ("-o", "-include"):  # output file; the precompiled header that hides missing includes
            skip = True
            continue
        if arg in ("-c", "-Winvalid-pch") or arg.startswith("-O"):
            continue
        if arg == entry["file"] or os.path.abspath(os.path.join(entry["directory"], arg)) == entry["file"]:
            continue
        out.append(arg)
    # Compiler flags gcc understands and clang 14 does not, if any appear, would stop the parse;
    # none do today. Warnings: the build's own set, as errors.
    # -Wmissing-field-initializers: C++20 aggregate initialisation leaves later members to their
    # defaults on purpose ({{"cpu"}, "fp32"}); GCC does not warn there either.
    out += ["-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers", "-Werror",
            "-Wno-unknown-warning-option"]
    for pattern in CHECK_ALSO:
        out += ["-Xiwyu", f"--check_also={pattern}"]
    out += ["-Xiwyu", "--no_fwd_decls", entry["file"]]
    return out


def parse_missing(output: str) -> "dict[str, set[str]]":
    """{file: {standard header it must add}} from IWYU's report."""
    missing, current = {}, None
    for line in output.splitlines():
        m = re.match(r"^(.*) should add these lines:$", line)
        if m:
            current = m.group(1)
            continue
        if line.endswith("should remove these lines:") or line.startswith("The full include-list"):
            current = None
            continue
        if current and (h := STD_HEADER.match(line)) and h.group(1) not in NOT_ENFORCED:
            path = os.path.abspath(current)
            if ours(path):
                missing.setdefault(os.path.relpath(path, ROOT), set()).add(h.group(1))
    return missing


def diagnostics(output: str) -> "list[str]":
    return [l for l in output.splitlines() if re.search(r": (error|warning|fatal error): ", l)]


def check(entry):
    result = subprocess.run(iwyu_command(entry), cwd=entry["directory"], capture_output=True, text=True)
    text = result.stdout + result.stderr
    return entry["file"], parse_missing(text), diagnostics(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("build_dir")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("TORCHBRIDGE_JOBS", "2")))
    parser.add_argument("--filter", default="", help="only files whose path contains this text")
    args = parser.parse_args()
    with open(os.path.join(args.build_dir, "compile_commands.json")) as f:
        entries = [e for e in json.load(f) if ours(e["file"]) and args.filter in e["file"]]
    # One entry per source file (a file compiled into two targets needs one check).
    entries = list({e["file"]: e for e in entries}.values())
    if not entries:
        print(f"check_includes: no project sources in {args.build_dir}/compile_commands.json", file=sys.stderr)
        return 1
    missing, problems = {}, []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for file, file_missing, file_diagnostics in pool.map(check, entries):
            for path, headers in file_missing.items():
                missing.setdefault(path, set()).update(headers)
            problems += [d for d in file_diagnostics if ours(d.split(":", 1)[0])]
    for line in sorted(set(problems)):
        print(line)
    for path in sorted(missing):
        print(f"{path}: uses the standard library without including " +
              ", ".join(f"<{h}>" for h in sorted(missing[path])))
    print(f"check_includes: {len(entries)} translation units, {len(missing)} files missing standard includes, "
          f"{len(set(problems))} clang diagnostics")
    return 1 if missing or problems else 0


if __name__ == "__main__":
    sys.exit(main())
