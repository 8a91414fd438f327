#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run every test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"

status=0
ctest --test-dir build --output-on-failure -j "${TORCHBRIDGE_JOBS:-2}" | tee build/ctest-output.txt || status=$?

# Tests for absent hardware skip; say which and why, so a skip is never mistaken for a pass.
log=build/Testing/Temporary/LastTest.log
if [[ -f "$log" ]] && grep -q ": Skipped" "$log"; then
  echo
  echo "Skipped tests and their reasons:"
  grep -A1 ": Skipped" "$log" | grep -v -e "^--$" -e ": Skipped$" | sort | uniq -c | sed 's/^/  /'
fi
# End with CTest's own verdict line, so it is the last thing a reader (or CI) sees.
grep -E "tests passed|tests failed" build/ctest-output.txt | tail -1 || true
exit $status
