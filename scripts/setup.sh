#!/usr/bin/env bash
# One idempotent set-up path behind both README commands:
#   Debian packages -> .venv with the pinned Python packages -> CMake configure (Ninja, ccache) -> build.
# Each step is skipped when it is already satisfied, so re-running costs seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# --main-job: build only what the main job runs (library, CLI, devices, Python package); the
# default builds everything, tests and benchmarks too. A later full set-up builds the rest.
SCOPE=all
case "${1:-}" in
  "") ;;
  --main-job) SCOPE=main ;;
  *) echo "setup.sh: unknown argument '$1' (expected nothing or --main-job)" >&2; exit 2 ;;
esac
# Each phase line carries the seconds since the set-up began, so a long wait is never a silent one.
log() { printf '[setup %4ds] %s\n' "$SECONDS" "$*" >&2; }

# ---- 1. Debian packages -------------------------------------------------------------------------
# debootstrap: scripts/gcc13-check.sh takes GCC 13 from a Debian 13 root (CTest lint.gcc13_build).
DEBIAN_PACKAGES=(cmake ninja-build ccache g++ pkg-config libgtest-dev nlohmann-json3-dev iwyu debootstrap)
missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# Debian's own python3 needs python3-venv for `python3 -m venv`; other Pythons carry venv themselves.
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then missing+=(python3-venv); fi
if ((${#missing[@]})); then
  SUDO=""
  if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- 2. Python virtual environment --------------------------------------------------------------
PY="$ROOT/.venv/bin/python"
if [[ ! -x "$PY" ]]; then
  log "creating .venv"
  python3 -m venv "$ROOT/.venv"
fi
# Reinstall only when the requirements changed since the last successful install.
req_hash="$(sha256sum requirements-dev.txt | cut -d' ' -f1)"
stamp="$ROOT/.venv/.torchbridge-requirements"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$req_hash" ]]; then
  log "installing Python packages from requirements-dev.txt"
  "$PY" -m pip install -q --disable-pip-version-check -r requirements-dev.txt
  echo "$req_hash" >"$stamp"
fi

# ---- 3. Configure and build ---------------------------------------------------------------------
TORCH_PREFIX="$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
if [[ ! -f build/build.ninja ]]; then
  log "configuring build/ (Ninja, ccache)"
  cmake -S . -B build -G Ninja \
    -DCMAKE_BUILD_TYPE="${TORCHBRIDGE_BUILD_TYPE:-Release}" \
    -DTORCHBRIDGE_WERROR=ON \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DPython3_EXECUTABLE="$PY" >/dev/null
fi
BUILD_TARGET=()
PACKAGE_TARGET=()
if [[ "$SCOPE" == main ]]; then
  BUILD_TARGET=(--target torchbridge_main_job)
  PACKAGE_TARGET=(-C build.targets=torchbridge_main_job)
fi
log "building ${SCOPE/main/what the main job needs} (minutes on a clean 2-core machine; ccache makes rebuilds fast)"
cmake --build build -j "${TORCHBRIDGE_JOBS:-2}" "${BUILD_TARGET[@]}"

# ---- 4. The Python package, into .venv (reinstalled only when its sources changed) --------------
# No build isolation: the extension must compile against the torch installed above. The package is
# built in build/ itself, with the options configured above, so nothing compiles a second time:
# scikit-build-core reconfigures it for the wheel and installs what is already built.
package_hash="$(find python src include cli devices cmake -type f -print0 | sort -z | xargs -0 sha256sum \
  | cat - pyproject.toml CMakeLists.txt VERSION | sha256sum | cut -d' ' -f1)"
package_stamp="$ROOT/.venv/.torchbridge-package"
if [[ ! -f "$package_stamp" || "$(cat "$package_stamp")" != "$package_hash" ]]; then
  log "installing the torchbridge Python package into .venv"
  "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
    -C build-dir=build -C cmake.build-type="${TORCHBRIDGE_BUILD_TYPE:-Release}" \
    -C cmake.define.TORCHBRIDGE_BUILD_TESTS=ON -C cmake.define.TORCHBRIDGE_BUILD_BENCHMARKS=ON \
    -C cmake.define.TORCHBRIDGE_WERROR=ON "${PACKAGE_TARGET[@]}" "$ROOT"
  echo "$package_hash" >"$package_stamp"
fi
log "set-up complete"
