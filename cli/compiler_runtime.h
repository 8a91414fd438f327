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
    no_compiler,  // $CXX / g++ cannot be started
    unknown,      // the probe did not build, or readelf could not read it
  };
  Kind kind = Kind::unknown;
  std::string compiler;  // as it was started: $CXX, or g++
  std::string detail;    // for unknown: why
};

// Builds a one-function shared library with the compiler in a temporary folder, reads what it
// needs with readelf (binutils, which every GCC or Clang toolchain has), and removes the folder.
CompilerRuntime probe_compiler_runtime();

}  // namespace torchbridge::cli
