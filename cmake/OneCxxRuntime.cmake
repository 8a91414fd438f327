# One C++ runtime per process, and it is torch's.
#
# Some toolchains link libstdc++ statically into the shared libraries they build: the GPU images'
# /opt/gcc (GCC 13.3) did (libstdc++'s own functions turned up inside libtorchbridge.so). A
# TorchBridge library that carries its own copy of libstdc++ into a process where torch has loaded
# the shared libstdc++.so.6 gets two sets of iostream and locale state whose symbols interpose on
# each other: a facet looked up by the index one copy assigned can be another facet in the other
# copy. On the H200 run (2026-11-26) a Python process died with SIGSEGV inside
# std::ostream::_M_insert<long>, found in libtorchbridge itself, while formatting an exception's
# message after CUDA's initialisation; the H100 run's Python crashes (2026-11-25) came at the
# same kind of place. A library built so on the development machine formats a number
# wrongly, or crashes, once torch is imported (tests/cxx_runtime/static_toolchain.sh).
#
# torchbridge_use_torchs_cxx_runtime(REFERENCE_LIBRARY) probes whether this compiler, with the
# flags of this build, links the C++ runtime statically into a shared library or a program. If
# it does, every C++ target of the calling directory and below is linked against the
# libstdc++.so.6 that REFERENCE_LIBRARY (a torch library) loads, ahead of the toolchain's static
# archive, which then contributes nothing. A toolchain that links the runtime dynamically is
# left as it is.
function(torchbridge_use_torchs_cxx_runtime reference_library)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang)$" OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  set(probe_dir "${CMAKE_BINARY_DIR}/CMakeFiles/cxx_runtime_probe")
  file(MAKE_DIRECTORY "${probe_dir}")
  file(WRITE "${probe_dir}/probe.cpp"
       "#include <sstream>\n#include <string>\n"
       "std::string torchbridge_probe(long v) { std::ostringstream s; s << v; return s.str(); }\n"
       "#ifdef PROBE_MAIN\nint main() { return torchbridge_probe(7).size() == 1 ? 0 : 1; }\n#endif\n")
  # A shared library and a program, each with this build's flags: a toolchain (or a flag) may link
  # the runtime statically into either.
  separate_arguments(compile_flags UNIX_COMMAND "${CMAKE_CXX_FLAGS}")
  separate_arguments(shared_flags UNIX_COMMAND "${CMAKE_SHARED_LINKER_FLAGS}")
  separate_arguments(program_flags UNIX_COMMAND "${CMAKE_EXE_LINKER_FLAGS}")
  set(static_in "")
  foreach(kind "shared libraries" "programs")
    if(kind STREQUAL "shared libraries")
      set(arguments -fPIC -shared "${probe_dir}/probe.cpp" ${shared_flags} -o "${probe_dir}/probe.so")
      set(output "${probe_dir}/probe.so")
    else()
      set(arguments -DPROBE_MAIN "${probe_dir}/probe.cpp" ${program_flags} -o "${probe_dir}/probe")
      set(output "${probe_dir}/probe")
    endif()
    execute_process(COMMAND "${CMAKE_CXX_COMPILER}" ${compile_flags} ${arguments}
                    RESULT_VARIABLE probe_result ERROR_VARIABLE probe_error OUTPUT_QUIET)
    if(NOT probe_result EQUAL 0)
      message(FATAL_ERROR "TorchBridge: could not build a probe (${kind}) with ${CMAKE_CXX_COMPILER} to see "
                          "how it links the C++ runtime:\n${probe_error}")
    endif()
    # ldd (glibc's, as for torch's runtime below) lists the shared runtime when the probe needs it.
    execute_process(COMMAND ldd "${output}" OUTPUT_VARIABLE dependencies)
    if(NOT dependencies MATCHES "lib(stdc|c)\\+\\+\\.so")
      list(APPEND static_in "${kind}")
    endif()
  endforeach()
  if(NOT static_in)
    return()  # the shared runtime: the one torch uses is found at run time
  endif()
  string(REPLACE ";" " and " static_in "${static_in}")

  # The libstdc++.so.6 torch loads, as the dynamic loader resolves it for torch's own library.
  execute_process(COMMAND ldd "${reference_library}" OUTPUT_VARIABLE loaded RESULT_VARIABLE ldd_result)
  string(REGEX MATCH "libstdc\\+\\+\\.so\\.6 => ([^ \n]+)" found "${loaded}")
  set(runtime "${CMAKE_MATCH_1}")
  if(NOT ldd_result EQUAL 0 OR NOT runtime OR NOT EXISTS "${runtime}")
    message(FATAL_ERROR
      "TorchBridge: ${CMAKE_CXX_COMPILER} links the C++ runtime statically into ${static_in}, and "
      "the shared libstdc++.so.6 that torch loads could not be found through 'ldd ${reference_library}'. "
      "A second copy of libstdc++ beside torch's breaks iostreams and locales at run time (see "
      "cmake/OneCxxRuntime.cmake). Use a compiler that links libstdc++ dynamically.")
  endif()
  message(STATUS "TorchBridge: ${CMAKE_CXX_COMPILER} links libstdc++ statically into ${static_in}; "
                 "linking torch's ${runtime} instead, so each process has one C++ runtime")
  set(CMAKE_CXX_STANDARD_LIBRARIES "${CMAKE_CXX_STANDARD_LIBRARIES} ${runtime}" PARENT_SCOPE)
endfunction()
