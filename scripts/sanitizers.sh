#!/usr/bin/env bash
# The C++ suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/), the fuzzers'
# stored corpora replayed there, and the emu runtime's stream/event tests under ThreadSanitizer
# (build-tsan/): what a developer runs before calling C++ work done. Not part of CI: on the 2-core
# development machine it does not fit beside the regular suite (README, "Sanitizers").
#   scripts/sanitizers.sh [asan|tsan|all]     (default all)
# Needs the set-up done (scripts/setup.sh) for torch. libtorch is linked as built, uninstrumented;
# only this project's code is instrumented (CMake option TORCHBRIDGE_SANITIZE).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WHICH="${1:-all}"
JOBS="${TORCHBRIDGE_JOBS:-2}"
START=$SECONDS
phase() { printf '[sanitizers %4ds] %s\n' "$((SECONDS - START))" "$*"; }
[[ -x .venv/bin/python ]] || { echo "run scripts/setup.sh first (torch comes from .venv)" >&2; exit 2; }
TORCH_PREFIX="$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"

configure() {  # configure DIR SANITIZERS
  [[ -f "$1/build.ninja" ]] && return
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE= -DCMAKE_CXX_FLAGS="-O1 -g" -DTORCHBRIDGE_SANITIZE="$2" \
    -DTORCHBRIDGE_BUILD_PYTHON=OFF -DTORCHBRIDGE_BUILD_BENCHMARKS=OFF -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DPython3_EXECUTABLE="$ROOT/.venv/bin/python" >/dev/null
}

if [[ "$WHICH" == asan || "$WHICH" == all ]]; then
  phase "asan+ubsan: configuring and building build-asan/ (the first build takes ~25 min on 2 cores)"
  configure build-asan address,undefined
  cmake --build build-asan -j "$JOBS"
  phase "asan+ubsan: the C++ suite and the fuzz corpora (Python, lint and install tests are not C++ under test)"
  # Leak checking is off: libtorch's static registries are never freed and it is not instrumented.
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    ctest --test-dir build-asan -E '^(python|lint|install|bench)\.' -j "$JOBS" --output-on-failure
fi

if [[ "$WHICH" == tsan || "$WHICH" == all ]]; then
  phase "tsan: building the emu runtime and its tests in build-tsan/"
  configure build-tsan thread
  cmake --build build-tsan -j "$JOBS" --target emu_runtime_tests
  phase "tsan: the emu runtime's tests (streams, events, transfers on its worker threads)"
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" ctest --test-dir build-tsan -R '^EmuRuntime' -j "$JOBS" \
    --output-on-failure
fi
phase "done"
