#!/usr/bin/env bash
# torch.nn's own module samples (torch.testing._internal.common_modules.module_db) on an SDK device
# against the CPU: every ModuleInfo, float32 and float64, training and eval mode. Prints one line per
# run with the figure the README quotes (modules tried / agreed / expected failures / crashes, time).
#   scripts/module_sweep.sh                  # emu, guarded and host-addressable memory
#   scripts/module_sweep.sh cudasdk          # a real GPU through the CUDA SDK runtime
#   scripts/module_sweep.sh emu --verbose    # further options go to tests/python/module_sweep.py
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" >&2
device="${1:-emu}"
shift || true
sweep=("$ROOT/.venv/bin/python" "$ROOT/tests/python/module_sweep.py" --device "$device" --jobs "${TORCHBRIDGE_JOBS:-2}" "$@")
if [[ "$device" == emu ]]; then
  status=0
  TORCHBRIDGE_EMU_GUARDED=1 "${sweep[@]}" || status=1
  TORCHBRIDGE_EMU_GUARDED=0 "${sweep[@]}" || status=1
  exit $status
fi
exec "${sweep[@]}"
