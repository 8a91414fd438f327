#!/usr/bin/env bash
# The full OpInfo sweep: every OpInfo of PyTorch's op_db on an SDK device against the CPU
# (tests/python/opinfo_sweep.py), in the device's memory modes, with the figures the README records.
#
#   scripts/opinfo_sweep.sh [DEVICE] [extra opinfo_sweep.py arguments]
#
# DEVICE defaults to emu, which is swept guarded and host-addressable; any other SDK device
# (cudasdk on a machine with an NVIDIA GPU) is swept as it is. Results land in build/opinfo-sweep/.
# Exit status 0 only when nothing disagrees beyond the reviewed expected-failure list and nothing
# crashes or hangs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"

DEVICE="${1:-emu}"
shift || true
OUT="$ROOT/build/opinfo-sweep"
mkdir -p "$OUT"
PY="$ROOT/.venv/bin/python"
status=0
run() {  # run NAME [ENV=VALUE...]
  local name="$1"; shift
  echo "== OpInfo sweep: $DEVICE ($name)"
  env "$@" "$PY" tests/python/opinfo_sweep.py --device "$DEVICE" --jobs "${TORCHBRIDGE_JOBS:-2}" --quiet \
    --results "$OUT/$DEVICE-$name.jsonl" --summary "$OUT/$DEVICE-$name.json" --log-dir "$OUT/$DEVICE-$name-logs" \
    "${EXTRA[@]}" || status=1
}
EXTRA=("$@")
if [[ "$DEVICE" == emu ]]; then
  run guarded TORCHBRIDGE_EMU_GUARDED=1
  run host-addressable TORCHBRIDGE_EMU_GUARDED=0
else
  run default
fi
exit $status
