#!/usr/bin/env bash
# Runs one contract test against a deliberately broken emu runtime and passes only if that test
# FAILS cleanly (an assertion failure, exit code 1) — not if it passes, crashes or hangs.
set -uo pipefail
binary="$1"; fault="$2"; filter="$3"
output="$(TORCHBRIDGE_EMU_GUARDED=1 TORCHBRIDGE_EMU_FAULT="$fault" timeout 120 "$binary" --gtest_filter="$filter" 2>&1)"
status=$?
echo "$output" | tail -20
if [[ $status -ne 1 ]]; then
  echo "expected the contract test to fail with exit code 1 under fault '$fault', got $status" >&2
  exit 1
fi
grep -q "\[  FAILED  \] $filter" <<<"$output" || { echo "the failure was not reported for $filter" >&2; exit 1; }
echo "fault '$fault' was caught by $filter"
