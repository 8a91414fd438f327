#!/usr/bin/env bash
# Builds the whole project (library, CLI, devices, tests, benchmarks; cudasdk when a CUDA toolkit
# is here) with GCC 13 and warnings as errors, as the GPU images do: the first H100 run broke on
# four GCC 13 diagnostics that this machine's GCC 12 never emits. Debian 12 has no GCC 13, so the
# compiler comes from a Debian 13 (trixie) root made once with debootstrap; the build runs there in
# a private mount namespace that sees this checkout and the project's torch, and it is left again
# with nothing mounted outside. The C++ code only compiles and links; nothing built runs, since a
# program built against trixie's C++ library needs that library to run.
#
#   scripts/gcc13-check.sh [BUILD_DIR]     (default build/gcc13; CTest runs it as lint.gcc13_build)
#
# Needs root (debootstrap, chroot, mount) and Debian's archive the first time (about 700 MB, one
# minute here); without root it exits 77, which CTest reports as a skip naming this reason.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$(realpath -m "${1:-$ROOT/build/gcc13}")"
CACHE="${TORCHBRIDGE_GCC13_CACHE:-/var/cache/torchbridge}"
SYSROOT="$CACHE/trixie-gcc13"
# googletest: its sources, built here with GCC 13 (trixie's libgtest.a, built by GCC 14, needs GCC 14's
# C++ runtime to link).
PACKAGES=g++-13,cmake,ninja-build,ccache,python3,googletest,nlohmann-json3-dev
PY="$ROOT/.venv/bin/python"
log() { printf '[gcc13-check %4ds] %s\n' "$SECONDS" "$*" >&2; }

if [[ "$(id -u)" != 0 ]]; then
  echo "gcc13-check: needs root to make and enter the Debian 13 root that provides GCC 13 (debootstrap, chroot, mount)" >&2
  exit 77
fi
for tool in debootstrap unshare chroot; do
  command -v "$tool" >/dev/null || { echo "gcc13-check: '$tool' is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done

# ---- the Debian 13 root, made once; a stamp names the package list it was made with -------------
if [[ ! -f "$SYSROOT/.torchbridge-packages" || "$(cat "$SYSROOT/.torchbridge-packages")" != "$PACKAGES" ]]; then
  log "making a Debian 13 root with GCC 13 in $SYSROOT (once per machine)"
  rm -rf "$SYSROOT"
  mkdir -p "$SYSROOT"
  debootstrap --variant=minbase --include="$PACKAGES" trixie "$SYSROOT" http://deb.debian.org/debian \
    >"$CACHE/trixie-gcc13.debootstrap.log" 2>&1 ||
    { tail -n 20 "$CACHE/trixie-gcc13.debootstrap.log" >&2; echo "gcc13-check: debootstrap failed" >&2; exit 1; }
  echo "$PACKAGES" >"$SYSROOT/.torchbridge-packages"
fi

# ---- what the build sees, at the same paths as here ------------------------------------------------
TORCH_PACKAGE="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
CUDA_TOOLKIT=""
if [[ -x /usr/local/cuda/bin/nvcc ]]; then CUDA_TOOLKIT="$(realpath /usr/local/cuda)"; fi
mkdir -p "$BUILD" "$CACHE/ccache-gcc13"

# The commands run in the root, as one bash script; its arguments follow it.
INSIDE="$(cat <<'EOF'
set -euo pipefail
root="$1" build="$2" torch="$3" cuda="$4"
export CCACHE_DIR=/var/cache/ccache  # the project's CMake sets ccache's sloppiness and base directory
gtest="$build/googletest"
if [[ ! -f "$gtest/lib/cmake/GTest/GTestConfig.cmake" ]]; then
  cmake -S /usr/src/googletest -B "$gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
    -DCMAKE_CXX_COMPILER=g++-13 -DCMAKE_C_COMPILER=gcc-13 -DCMAKE_INSTALL_PREFIX="$gtest" >"$build/googletest.log" 2>&1 &&
    cmake --build "$gtest-build" -j "${JOBS:-2}" >>"$build/googletest.log" 2>&1 &&
    cmake --install "$gtest-build" >>"$build/googletest.log" 2>&1 ||
    { tail -n 30 "$build/googletest.log"; exit 1; }
fi
cuda_args=()
[[ -n "$cuda" ]] && cuda_args=(-DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DCMAKE_CUDA_HOST_COMPILER=g++-13 -DCUDAToolkit_ROOT="$cuda")
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCHBRIDGE_WERROR=ON \
    -DCMAKE_C_COMPILER=gcc-13 -DCMAKE_CXX_COMPILER=g++-13 -DCMAKE_PREFIX_PATH="$gtest" \
    -DTorch_DIR="$torch/share/cmake/Torch" -DTORCHBRIDGE_BUILD_PYTHON=OFF \
    -DPython3_EXECUTABLE=/usr/bin/python3 "${cuda_args[@]}" >"$build/configure.log" 2>&1 ||
    { tail -n 30 "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j "${JOBS:-2}" -- -k 0
EOF
)"

log "building with $(chroot "$SYSROOT" g++-13 --version | head -1) in $BUILD"
# A private mount namespace: every mount below ends with the command, whatever way it ends.
unshare --mount --propagation private bash -c '
  set -euo pipefail
  sysroot="$1" root="$2" build="$3" torch="$4" cuda="$5" ccache="$6" inside="$7"
  bind() { mkdir -p "$sysroot$2"; mount --bind "$1" "$sysroot$2"; [[ "${3:-}" == ro ]] && mount -o remount,bind,ro "$sysroot$2"; return 0; }
  mount -t proc proc "$sysroot/proc"
  bind /dev /dev
  bind "$root" "$root"
  [[ "$build" == "$root"/* ]] || bind "$build" "$build"
  bind "$torch" "$torch" ro
  [[ -z "$cuda" ]] || bind "$cuda" "$cuda" ro
  bind "$ccache" /var/cache/ccache
  chroot "$sysroot" env JOBS="${JOBS:-2}" PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    bash -c "$inside" inside "$root" "$build" "$torch" "$cuda"
' gcc13 "$SYSROOT" "$ROOT" "$BUILD" "$TORCH_PACKAGE" "$CUDA_TOOLKIT" "$CACHE/ccache-gcc13" "$INSIDE"
log "GCC 13 built everything with warnings as errors"
