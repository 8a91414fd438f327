#!/usr/bin/env bash
# Runs scripts/gpu-check.sh across several short calls of a remote-command tool (the device tool
# stops a command after 10 minutes, and the whole check takes longer): the check runs detached in
# its own session, so it outlives the call that started it, and each call waits a while for it.
#
#   scripts/gpu-check-detached.sh start [gpu-check.sh arguments...]   starts it, then waits
#   scripts/gpu-check-detached.sh wait                                  waits again
#
# Each call waits up to WAIT_S seconds (default 540), prints the steps finished so far and, when the
# check has ended, its summary table; exits 0 when the check passed, 1 when it failed, 3 while it is
# still running. Where $OUT is set (the device tool), the logs are packed into $OUT/gpu-check-logs.tgz
# each time, so what ran comes back even if the machine is lost before the next call.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK=/tmp/torchbridge-gpu-check
STATE="$WORK/detached"
mode="${1:-}"; shift || true

case "$mode" in
  start)
    rm -rf "$STATE"; mkdir -p "$STATE"
    # setsid: a new session, so the check is not killed with the calling command.
    setsid bash -c 'bash "$1"/scripts/gpu-check.sh --work "$2" "${@:4}" >"$3/output" 2>&1 </dev/null; echo $? >"$3/rc"' \
      _ "$ROOT" "$WORK" "$STATE" "$@" &
    ;;
  wait) [[ -d "$STATE" ]] || { echo "gpu-check-detached: nothing started in $STATE" >&2; exit 2; } ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

deadline=$((SECONDS + ${WAIT_S:-540}))
while [[ ! -f "$STATE/rc" ]] && ((SECONDS < deadline)); do sleep 5; done

if [[ -n "${OUT:-}" ]]; then
  tar czf "$OUT/gpu-check-logs.tgz" -C "$WORK" logs detached 2>/dev/null
fi
if [[ ! -f "$STATE/rc" ]]; then
  grep '^\[gpu-check\]' "$STATE/output" | grep -v '^\[gpu-check\] running ' || true
  echo "gpu-check-detached: still running ($(grep '^\[gpu-check\] running ' "$STATE/output" | tail -1 | cut -c13-)); call '$0 wait' again"
  exit 3
fi
if grep -q '^TorchBridge GPU check' "$STATE/output"; then
  sed -n '/^TorchBridge GPU check/,$p' "$STATE/output"
else  # it stopped before its summary (a failed build, a bad argument)
  grep '^\[gpu-check\]' "$STATE/output" | grep -v '^\[gpu-check\] running '; tail -n 5 "$STATE/output"
fi
exit "$(cat "$STATE/rc")"
