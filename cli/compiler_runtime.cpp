#include "compiler_runtime.h"

#include "child_process.h"
#include "temporary_directory.h"

#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

namespace torchbridge::cli {
namespace {

// A formatted number: pulls the runtime's locale machinery in, as the std::regex of AOTInductor's
// device parsing does, so a toolchain that links the runtime statically copies it in.
constexpr const char* kProbeSource = R"(#include <sstream>
#include <string>
std::string torchbridge_probe(int n) { std::ostringstream s; s << n; return s.str(); }
)";

CompilerRuntime probe_in(const std::string& folder, CompilerRuntime result) {
  const std::string source = folder + "/probe.cpp";
  const std::string library = folder + "/libprobe.so";
  std::ofstream(source) << kProbeSource;
  ChildResult built;
  try {
    built = run_program({result.compiler, "-shared", "-fPIC", "-o", library, source});
  } catch (const std::exception& e) {
    result.kind = CompilerRuntime::Kind::no_compiler;
    result.detail = e.what();
    return result;
  }
  if (built.signal != 0 || built.exit_code != 0) {
    const std::string error = built.last_error_line();
    result.detail = "the probe library did not build (" + result.compiler + " " + built.describe_exit() +
                    (error.empty() ? "" : ": " + error) + ")";
    return result;
  }
  ChildResult dynamic_section;
  try {
    dynamic_section = run_program({"readelf", "-d", library});
  } catch (const std::exception& e) {
    result.detail = std::string("readelf cannot be started to read the probe library: ") + e.what();
    return result;
  }
  if (dynamic_section.exit_code != 0) {
    result.detail = "readelf " + dynamic_section.describe_exit() + ": " + dynamic_section.last_error_line();
    return result;
  }
  const std::string& needed = dynamic_section.out;
  const bool shared = needed.find("[libstdc++.so") != std::string::npos || needed.find("[libc++.so") != std::string::npos;
  result.kind = shared ? CompilerRuntime::Kind::shared : CompilerRuntime::Kind::copied;
  return result;
}

}  // namespace

const char* kind_name(CompilerRuntime::Kind kind) {
  switch (kind) {
    case CompilerRuntime::Kind::shared:
      return "shared";
    case CompilerRuntime::Kind::copied:
      return "copied";
    case CompilerRuntime::Kind::no_compiler:
      return "no_compiler";
    case CompilerRuntime::Kind::unknown:
      break;
  }
  return "unknown";
}

std::string inductor_compiler_from_environment() {
  const char* cxx = std::getenv("CXX");
  return cxx != nullptr && *cxx != '\0' ? cxx : "g++";
}

CompilerRuntime probe_compiler_runtime(const std::string& compiler) {
  CompilerRuntime result;
  result.compiler = compiler;
  try {
    const TemporaryDirectory folder("torchbridge-doctor");
    result = probe_in(folder.path(), result);
  } catch (const std::exception& e) {  // the folder could not be made: the check cannot tell
    result.kind = CompilerRuntime::Kind::unknown;
    result.detail = e.what();
  }
  return result;
}

}  // namespace torchbridge::cli
