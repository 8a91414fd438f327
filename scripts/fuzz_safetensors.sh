#!/usr/bin/env bash
# Builds the safetensors reader with clang's libFuzzer and AddressSanitizer and fuzzes it.
#   scripts/fuzz_safetensors.sh [RUNS]     (default 1,000,000 executions)
# Needs the set-up done (scripts/setup.sh); installs Debian's clang when missing (fuzz_common.sh).
set -euo pipefail
RUNS="${1:-1000000}"
source "$(dirname "${BASH_SOURCE[0]}")/fuzz_common.sh"
OUT="$ROOT/build/fuzz"
mkdir -p "$OUT/corpus"
build_fuzzer "$OUT/safetensors_fuzzer" \
  "$ROOT/fuzz/safetensors_fuzzer.cpp" "$ROOT/src/checkpoint/safetensors_reader.cpp" \
  "$ROOT/src/checkpoint/safetensors_header.cpp" "$ROOT/src/checkpoint/dtypes.cpp"
# Seed the corpus with a valid file so the fuzzer starts from the format's real shape.
"$ROOT/.venv/bin/python" - "$OUT/corpus/seed.safetensors" <<'PY'
import sys, torch
from safetensors.torch import save_file
save_file({"w": torch.arange(6.0).view(2, 3), "i": torch.arange(3), "h": torch.ones(2, dtype=torch.bfloat16)},
          sys.argv[1], metadata={"format": "pt"})
PY
run_fuzzer "$OUT/safetensors_fuzzer" "$OUT/corpus" "$RUNS"
