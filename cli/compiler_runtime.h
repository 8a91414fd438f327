#pragma once
// Which C++ runtime the libraries this machine's compiler builds will use: `torchbridge doctor`'s
// "C++ compiler runtime" check. torch's inductor compiles with $CXX or g++ (AOTInductor packages,
// the CPU kernels of torch.compile), as torch.utils.cpp_extension does, and a Python process
// then loads what it built. A toolchain that copies libstdc++ into shared libraries (the GPU
// images' /opt/gcc) gives those libraries a second C++ runtime beside torch's, which crashed
// AOTInductor packages on an H200 (docs/device-sdk.md).

#include <string>

namespace torchbridge::cli {

struct CompilerRuntime {
  enum class Kind {
    shared,       // the probe library needs libstdc++.so.6 (or libc++.so): one runtime per process
    copied,       // the probe library needs neither: its compiler linked the runtime into it
    no_compiler,  // the compiler cannot be started
    unknown,      // the probe did not build, or readelf could not read it
  };
  Kind kind = Kind::unknown;
  std::string compiler;  // as it was started
  std::string detail;    // for unknown: why
};

// "shared", "copied", "no_compiler" or "unknown", the enumerators' names.
const char* kind_name(CompilerRuntime::Kind kind);

// The compiler torch's inductor builds with: $CXX, else g++ (inductor's cpp.cxx default).
std::string inductor_compiler_from_environment();

// Builds a one-function shared library with `compiler` in a temporary folder, reads what it needs
// with readelf (binutils, which every GCC or Clang toolchain has), and removes the folder. Also
// what `torchbridge export --format aoti` asks before inductor compiles (Python's
// deployment/_cxx_runtime.py, through _C._probe_compiler_runtime).
CompilerRuntime probe_compiler_runtime(const std::string& compiler);

}  // namespace torchbridge::cli
