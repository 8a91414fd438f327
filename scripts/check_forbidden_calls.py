#!/usr/bin/env python3
"""Calls the project's C++ must not make, each with the reason and what to use instead; checked on
every test run (CTest: lint.forbidden_calls). Comments are not searched.

    scripts/check_forbidden_calls.py        exits 1 naming each file, line and call found
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ("include", "src", "cli", "python/src", "devices", "bench", "examples", "tests", "fuzz")
SUFFIXES = {".h", ".hpp", ".c", ".cc", ".cpp", ".cu"}

FORBIDDEN = [
    (re.compile(r"\bremove_all\s*\("),
     "std::filesystem::remove_all binds to the broken copy torch 2.11's libtorch.so exports and jumps to "
     "address 0 (include/torchbridge/remove_tree.h); use torchbridge::remove_tree"),
]

LINE_COMMENT = re.compile(r"//.*$")


def code_lines(path: pathlib.Path):
    """(line number, text) with // and /* */ comments blanked out."""
    in_block = False
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        text = ""
        while line:
            if in_block:
                end = line.find("*/")
                if end < 0:
                    line = ""
                    break
                line, in_block = line[end + 2:], False
            start = line.find("/*")
            if start < 0:
                text += line
                break
            text, line, in_block = text + line[:start], line[start + 2:], True
        yield number, LINE_COMMENT.sub("", text)


def main() -> int:
    found = []
    for directory in SOURCES:
        for path in sorted((ROOT / directory).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            for number, text in code_lines(path):
                for pattern, reason in FORBIDDEN:
                    if pattern.search(text):
                        found.append(f"{path.relative_to(ROOT)}:{number}: {text.strip()}\n    {reason}")
    for line in found:
        print(line)
    if found:
        print(f"check_forbidden_calls: {len(found)} forbidden call(s)")
        return 1
    print("check_forbidden_calls: none found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
