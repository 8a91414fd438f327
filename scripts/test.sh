#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run every test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
ctest --test-dir build --output-on-failure -j "${TORCHBRIDGE_JOBS:-2}"
