"""One C++ runtime per process, for the shared libraries AOTInductor compiles.

AOTInductor builds each package's model library with the machine's C++ compiler (inductor's
``cpp.cxx``, from ``$CXX`` or ``g++``) and then loads it into this process. Some toolchains link
libstdc++ statically into every shared library they build: the GPU images' ``/opt/gcc`` does.
Such a model library carries its own copy of the C++ runtime beside the libstdc++.so.6 torch has
loaded, and the two copies' locale state disagrees: on the H200 (2026-11-27) loading the package
died by SIGSEGV in ``std::regex``, inside the library's own ``parse_device_str``; the same
emulated here with ``-static-libstdc++`` throws ``std::bad_cast``. cmake/OneCxxRuntime.cmake
handles the same toolchain for TorchBridge's own libraries, in the same way: the runtime torch
uses goes on the link line, ahead of the toolchain's static archive, which then adds nothing.
"""

import contextlib
import functools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

# Uses the C++ runtime (a stream and a string), so a toolchain that links it dynamically must
# record libstdc++.so.6 (or libc++.so) as needed even under --as-needed.
_PROBE_SOURCE = ('#include <sstream>\n#include <string>\n'
                 'std::string torchbridge_probe(long v) { std::ostringstream s; s << v; return s.str(); }\n')


@functools.cache
def links_runtime_statically(compiler: str) -> bool:
    """Whether ``compiler`` copies the C++ runtime into the shared libraries it links. Asked on Linux
    only (ELF libraries, readelf); elsewhere False, and inductor is left as it is."""
    if not sys.platform.startswith("linux"):
        return False
    readelf = shutil.which("readelf")
    if readelf is None:  # binutils comes with every toolchain that can link on Linux
        raise RuntimeError(f"readelf (binutils) is missing, so whether {compiler} links libstdc++ statically into "
                           "shared libraries cannot be checked; install binutils")
    with tempfile.TemporaryDirectory(prefix="torchbridge-cxx-probe-") as folder:
        source, library = os.path.join(folder, "probe.cpp"), os.path.join(folder, "probe.so")
        with open(source, "w") as f:
            f.write(_PROBE_SOURCE)
        built = subprocess.run([compiler, "-shared", "-fPIC", source, "-o", library], capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"{compiler} could not build a probe library to see how it links the C++ runtime:\n"
                               f"{built.stderr.strip()}")
        dynamic = subprocess.run([readelf, "-d", library], capture_output=True, text=True, check=True).stdout
    return "libstdc++.so" not in dynamic and "libc++.so" not in dynamic


def runtime_of_this_process() -> "str | None":
    """The path of the libstdc++ shared library mapped into this process (torch's), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)  # address, perms, offset, dev, inode, then the path
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libstdc++.so"):
                    return fields[5].strip()
    except OSError:
        return None
    return None


@contextlib.contextmanager
def one_runtime_for_inductor():
    """Within the block, inductor links its shared libraries against this process's libstdc++ when
    its compiler would copy the runtime into them; with any other compiler nothing changes. The
    compiler is wrapped by a script, named as the compiler is (inductor tells GCC from Clang by
    the name), that appends the runtime only to a shared library's link."""
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder

    compiler = cpp_builder.get_cpp_compiler()
    if not links_runtime_statically(compiler):
        yield
        return
    runtime = runtime_of_this_process()
    if runtime is None:
        raise RuntimeError(f"{compiler} links libstdc++ statically into shared libraries, and this process has no "
                           "shared libstdc++ to link them against instead; a second copy of the C++ runtime in "
                           "the process breaks locales (a crash loading the package). Set CXX to a compiler that "
                           "links libstdc++ dynamically")
    real = shutil.which(compiler) or compiler
    with tempfile.TemporaryDirectory(prefix="torchbridge-cxx-") as folder:
        wrapper = os.path.join(folder, os.path.basename(real))
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\n"
                    f"# TorchBridge: {real} links libstdc++ statically; link shared libraries against {runtime}\n"
                    'for argument in "$@"; do\n'
                    f'  [ "$argument" = -shared ] && exec {shlex.quote(real)} "$@" {shlex.quote(runtime)}\n'
                    "done\n"
                    f'exec {shlex.quote(real)} "$@"\n')
        os.chmod(wrapper, 0o755)
        with inductor_config.patch({"cpp.cxx": (wrapper,)}):
            yield
