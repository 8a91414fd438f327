#!/usr/bin/env bash
# Collects what scripts/gpu-check.sh needs on a GPU machine that has no internet and no apt:
# GoogleTest's sources and the nlohmann-json headers with their CMake package files, taken from
# this (Debian) development machine's packages, into .offline/ at the repository root. The folder
# is ignored by git (through .git/info/exclude), so it never reaches a commit; copy it to the GPU
# machine together with the checkout (the device tool carries it with `carry: [".offline"]`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

"$ROOT/scripts/setup.sh" >/dev/null  # installs libgtest-dev and nlohmann-json3-dev when missing

OUT="$ROOT/.offline"
rm -rf "$OUT"
mkdir -p "$OUT/prefix/include" "$OUT/prefix/share/cmake"
cp -r /usr/src/googletest "$OUT/googletest"
cp -r /usr/include/nlohmann "$OUT/prefix/include/nlohmann"
# The package files locate the headers three directories up from themselves: prefix/include.
cp -r /usr/share/cmake/nlohmann_json "$OUT/prefix/share/cmake/nlohmann_json"

# Pure-Python test dependencies a GPU image may lack (torch's OpInfo samples import expecttest;
# the lent H100's image has none), as wheels that gpu-check.sh installs into its venv offline.
mkdir -p "$OUT/wheels"
"$ROOT/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$OUT/wheels" expecttest

if [[ -d .git ]] && ! grep -qx '/.offline/' .git/info/exclude 2>/dev/null; then
  echo '/.offline/' >>.git/info/exclude
fi
echo "prepared $OUT ($(du -sh "$OUT" | cut -f1)): googletest sources, nlohmann-json headers and CMake files, test wheels"
