#!/usr/bin/env bash
# The README's main command: set up (idempotent), then describe this machine's accelerators and check them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
"$ROOT/build/bin/torchbridge" info
echo
# doctor exits 2 for warnings only; that is a report, not a failure of this command.
status=0
"$ROOT/build/bin/torchbridge" doctor || status=$?
if [[ $status -eq 1 ]]; then exit 1; fi
