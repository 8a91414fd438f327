#!/usr/bin/env python3
"""Every binary the build made uses the process's one C++ runtime: no shared library, extension
module or program of the project carries its own copy of libstdc++ (cmake/OneCxxRuntime.cmake
says why a copy beside torch's breaks iostreams and locales, and what the GPU images' toolchain
does). A copy shows as a definition of std::locale::classic(), which only libstdc++ itself
defines; a program or library that uses the C++ runtime must need libstdc++.so.6 instead.

    scripts/check_cxx_runtime.py BUILD_DIR
"""

import pathlib
import subprocess
import sys

RUNTIME_SYMBOL = "_ZNSt6locale7classicEv"  # std::locale::classic(), defined only by libstdc++


def is_elf(path: pathlib.Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def defined_symbols(path: pathlib.Path) -> set:
    names = set()
    for table in ([], ["-D"]):  # the full table where the binary keeps one, the dynamic one always
        result = subprocess.run(["nm", *table, "--defined-only", str(path)], capture_output=True, text=True)
        names.update(line.split()[-1] for line in result.stdout.splitlines() if line.strip())
    return names


def needs_cxx_runtime(path: pathlib.Path) -> bool:
    dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return "libstdc++.so" in dynamic or "libc++.so" in dynamic


def main() -> int:
    build = pathlib.Path(sys.argv[1])
    binaries = [p for folder in ("lib", "bin", "python", "examples") if (build / folder).is_dir()
                for p in sorted((build / folder).rglob("*"))
                if p.is_file() and not p.is_symlink() and "CMakeFiles" not in p.parts and is_elf(p)]
    if not binaries:
        print(f"no binaries under {build}: build first", file=sys.stderr)
        return 1
    copies = [p for p in binaries if RUNTIME_SYMBOL in defined_symbols(p)]
    for path in copies:
        print(f"{path}: carries its own copy of libstdc++ (defines std::locale::classic()); "
              f"needs libstdc++.so.6: {needs_cxx_runtime(path)}", file=sys.stderr)
    print(f"{len(binaries)} binaries checked, {len(copies)} with their own C++ runtime")
    return 1 if copies else 0


if __name__ == "__main__":
    sys.exit(main())
