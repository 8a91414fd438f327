# Locates LibTorch inside the installed `torch` Python package, unless CMAKE_PREFIX_PATH already
# points at a LibTorch. One place decides which torch we build against; it must be >= 2.11.

# A CUDA build of torch makes find_package(Torch) look for the CUDA toolkit (CMake's FindCUDA: an
# nvcc, then the CUDA runtime beside it), although TorchBridge's own code includes no CUDA header.
# FindCUDA derives the toolkit from the nvcc on PATH, which fails when the toolkit is installed but
# not on PATH, or when that nvcc is a wrapper script outside the toolkit (this project's development
# machine has one). So the toolkit directory is named for it here; when there is none, the reason
# and the ways out are said before LibTorch's generic "cannot find the CUDA libraries".
function(_torchbridge_locate_cuda_toolkit torch_cuda_version)
  if(CUDA_TOOLKIT_ROOT_DIR)
    return()
  endif()
  set(_candidates "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" "/usr/local/cuda-${torch_cuda_version}" "/usr/local/cuda")
  find_program(_torchbridge_nvcc nvcc)
  if(_torchbridge_nvcc)
    get_filename_component(_nvcc_real "${_torchbridge_nvcc}" REALPATH)
    get_filename_component(_nvcc_toolkit "${_nvcc_real}/../.." ABSOLUTE)
    list(APPEND _candidates "${_nvcc_toolkit}")
  endif()
  foreach(_dir IN LISTS _candidates)
    if(_dir AND EXISTS "${_dir}/bin/nvcc" AND EXISTS "${_dir}/include/cuda_runtime.h")
      set(CUDA_TOOLKIT_ROOT_DIR "${_dir}" CACHE PATH "The CUDA toolkit LibTorch's CMake package uses" FORCE)
      message(STATUS "TorchBridge: torch is a CUDA ${torch_cuda_version} build; CUDA toolkit: ${_dir}")
      return()
    endif()
  endforeach()
  message(WARNING "TorchBridge: torch is a CUDA ${torch_cuda_version} build, and LibTorch's CMake package "
                  "(find_package(Torch)) then needs the CUDA toolkit (nvcc and the CUDA runtime), although "
                  "TorchBridge compiles no CUDA code. None was found (CUDA_HOME, CUDA_PATH, "
                  "/usr/local/cuda-${torch_cuda_version}, /usr/local/cuda, nvcc on PATH), so the next step is "
                  "likely to fail. Install the CUDA toolkit ${torch_cuda_version} or point CUDA_HOME at it, "
                  "or build against torch's CPU build (https://download.pytorch.org/whl/cpu).")
endfunction()

function(torchbridge_find_torch)
  if(NOT Torch_DIR)
    find_package(Python3 COMPONENTS Interpreter REQUIRED)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c
              "import torch.utils, torch.version; print(torch.utils.cmake_prefix_path); print(torch.version.cuda or '')"
      OUTPUT_VARIABLE _torch_query OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _torch_rc ERROR_VARIABLE _torch_err)
    if(NOT _torch_rc EQUAL 0)
      message(FATAL_ERROR "TorchBridge needs the torch Python package (>= 2.11) for "
                          "${Python3_EXECUTABLE}: ${_torch_err}")
    endif()
    string(REPLACE "\n" ";" _torch_query "${_torch_query}")
    list(GET _torch_query 0 _torch_prefix)
    list(LENGTH _torch_query _torch_query_lines)
    if(_torch_query_lines GREATER 1)
      list(GET _torch_query 1 _torch_cuda_version)
      _torchbridge_locate_cuda_toolkit("${_torch_cuda_version}")
    endif()
    list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
  endif()
  # Without an architecture list, a CUDA LibTorch's CMake package compiles and runs a program that
  # asks the GPUs present for theirs: that needs a GPU and, under CMake < 3.26, fails on the C++20
  # dialect it inherits. The list only feeds nvcc flags, and TorchBridge compiles no CUDA code.
  # (Set on every configure: a reconfigure skips the query above, Torch_DIR being cached.)
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "9.0")
    set(TORCH_CUDA_ARCH_LIST "9.0" PARENT_SCOPE)  # for the installed TorchBridgeConfig.cmake
  endif()
  find_package(Torch REQUIRED)
  if(Torch_VERSION VERSION_LESS 2.11)
    message(FATAL_ERROR "TorchBridge supports torch 2.11 and newer; found ${Torch_VERSION}")
  endif()
  message(STATUS "TorchBridge: building against torch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX})")
  set(TORCH_LIBRARIES "${TORCH_LIBRARIES}" PARENT_SCOPE)
  set(TORCH_INSTALL_PREFIX "${TORCH_INSTALL_PREFIX}" PARENT_SCOPE)
  set(TORCH_CXX_FLAGS "${TORCH_CXX_FLAGS}" PARENT_SCOPE)
  set(Torch_VERSION "${Torch_VERSION}" PARENT_SCOPE)
  set(Torch_DIR "${Torch_DIR}" CACHE PATH "LibTorch CMake config directory" FORCE)
endfunction()
