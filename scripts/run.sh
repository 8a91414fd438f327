#!/usr/bin/env bash
# The README's main command: set up (idempotent), then the portability run: detect the hardware,
# train the built-in transformer on the best backend, save a portable checkpoint, load it on every
# other backend (the CPU and the emulated device at least), validate, and report.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" --main-job
exec "$ROOT/build/bin/torchbridge" portability "$@"
