"""One C++ runtime per process, for the shared libraries AOTInductor compiles.

AOTInductor builds each package's model library with the machine's C++ compiler (inductor's
``cpp.cxx``, from ``$CXX`` or ``g++``) and then loads it into this process. Some toolchains link
libstdc++ statically into every shared library they build: the GPU images' ``/opt/gcc`` does.
Such a model library carries its own copy of the C++ runtime beside the libstdc++.so.6 torch has
loaded, and the two copies' locale state disagrees: on the H200 (2026-11-27) loading the package
died by SIGSEGV in ``std::regex``, inside the library's own ``parse_device_str``; the same
emulated here with ``-static-libstdc++`` throws ``std::bad_cast``. cmake/OneCxxRuntime.cmake
handles the same toolchain for TorchBridge's own libraries, in the same way: the runtime torch
uses goes on the link line ahead of the toolchain's static archive, which then only supplies
what that runtime lacks (nothing, unless the compiler's libstdc++ is newer than the process's).
"""

import contextlib
import functools
import hashlib
import os
import shlex
import shutil
import sys
import tempfile
import threading
import warnings

# inductor's compiler setting is process-wide: two exports in two threads would restore it under
# each other's compile.
_PATCHING = threading.Lock()


@functools.cache
def links_runtime_statically(compiler: str) -> bool:
    """Whether ``compiler`` copies the C++ runtime into the shared libraries it links: the probe of
    ``torchbridge doctor``'s "C++ compiler runtime" check (cli/compiler_runtime.cpp), which builds a
    one-function library and reads what it needs with readelf. Asked on Linux only (ELF libraries);
    elsewhere False. A compiler that cannot be started raises; a probe that cannot tell (no readelf,
    the probe does not build) warns and answers False, and inductor then compiles as it would."""
    if not sys.platform.startswith("linux"):
        return False
    from torchbridge import _C

    kind, detail = _C._probe_compiler_runtime(compiler)
    if kind == "no_compiler":
        raise RuntimeError(f"inductor's C++ compiler cannot be started: {detail}; set CXX to a C++ compiler")
    if kind == "unknown":
        warnings.warn(f"could not tell whether {compiler} links libstdc++ statically into shared libraries "
                      f"({detail}); if it does, the AOTInductor package may crash when loaded "
                      "(deployment/_cxx_runtime.py)", RuntimeWarning, stacklevel=3)
    return kind == "copied"


def runtime_of_this_process() -> "str | None":
    """The path of the libstdc++ shared library mapped into this process (torch's), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)  # address, perms, offset, dev, inode, then the path
                if len(fields) < 6:
                    continue
                path = fields[5].strip()
                # " (deleted)": the file was replaced after it was loaded; that one cannot be linked.
                if os.path.basename(path).startswith("libstdc++.so") and os.path.isfile(path):
                    return path
    except OSError:
        return None
    return None


def _wrapper_for(real: str, runtime: str) -> str:
    """A script that runs ``real`` and appends ``runtime`` to every shared-library link. It lives
    in inductor's cache folder (where inductor's own libraries are, so it can be executed), at a
    path fixed by compiler and runtime (inductor's cache keys and packages name the compiler), and
    ends with ``real``'s own path, because inductor tells GCC from Clang by the compiler's path."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        base = cache_dir()
    except ImportError:  # an inductor without this module: its default folder
        base = os.path.join(tempfile.gettempdir(), "torchinductor_" + str(os.getuid()))
    digest = hashlib.sha256(f"{real}\0{runtime}".encode()).hexdigest()[:16]  # hex: no "gcc" or "clang" in it
    wrapper = os.path.join(base, "torchbridge-cxx", digest, real.lstrip(os.sep))
    script = ("#!/bin/sh\n"
              f"# TorchBridge: {real} links libstdc++ statically; link shared libraries against {runtime}\n"
              'for argument in "$@"; do\n'
              f'  [ "$argument" = -shared ] && exec {shlex.quote(real)} "$@" {shlex.quote(runtime)}\n'
              "done\n"
              f'exec {shlex.quote(real)} "$@"\n')
    try:
        with open(wrapper) as f:
            if f.read() == script and os.access(wrapper, os.X_OK):
                return wrapper
    except OSError:
        pass
    os.makedirs(os.path.dirname(wrapper), exist_ok=True)
    partial = f"{wrapper}.{os.getpid()}.partial"  # another process may write the same script
    with open(partial, "w") as f:
        f.write(script)
    os.chmod(partial, 0o755)
    os.replace(partial, wrapper)
    return wrapper


@contextlib.contextmanager
def one_runtime_for_inductor():
    """Within the block, inductor links its shared libraries against this process's libstdc++ when
    its compiler would copy the runtime into them; with any other compiler, when inductor only
    writes C++ sources (package_cpp_only) or cross-compiles, nothing changes."""
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder

    aoti = inductor_config.aot_inductor
    if getattr(aoti, "package_cpp_only", False) or getattr(aoti, "cross_target_platform", None):
        yield
        return
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
    real = os.path.abspath(shutil.which(compiler) or compiler)  # inductor runs it from other folders
    wrapper = _wrapper_for(real, runtime)
    for kind in ("_is_gcc", "_is_clang"):  # the wrapper's path must read as the same compiler
        tell = getattr(cpp_builder, kind, None)
        if tell is not None and tell(wrapper) != tell(real):
            raise RuntimeError(f"the compiler wrapper {wrapper} would not be taken for the same kind of compiler as "
                               f"{real} by inductor ({kind}); set TORCHINDUCTOR_CACHE_DIR to a folder whose path "
                               "contains neither 'gcc' nor 'clang'")
    with _PATCHING, inductor_config.patch({"cpp.cxx": (wrapper,)}):
        yield
