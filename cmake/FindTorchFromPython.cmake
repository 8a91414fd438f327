# Locates LibTorch inside the installed `torch` Python package, unless CMAKE_PREFIX_PATH already
# points at a LibTorch. One place decides which torch we build against; it must be >= 2.11.
function(torchbridge_find_torch)
  if(NOT Torch_DIR)
    find_package(Python3 COMPONENTS Interpreter REQUIRED)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _torch_rc ERROR_VARIABLE _torch_err)
    if(NOT _torch_rc EQUAL 0)
      message(FATAL_ERROR "TorchBridge needs the torch Python package (>= 2.11) for "
                          "${Python3_EXECUTABLE}: ${_torch_err}")
    endif()
    list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
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
