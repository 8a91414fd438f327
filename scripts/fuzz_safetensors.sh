#!/usr/bin/env bash
# Builds the safetensors reader with clang's libFuzzer and AddressSanitizer and fuzzes it.
#   scripts/fuzz_safetensors.sh [RUNS]     (default 1,000,000 executions)
# Needs the set-up done (scripts/setup.sh) for torch; installs Debian's clang when missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${1:-1000000}"
if ! command -v clang++ >/dev/null; then
  SUDO=""; [[ "$(id -u)" != 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang >/dev/null
fi
TORCH="$("$ROOT/.venv/bin/python" -c 'import torch, os; print(os.path.dirname(torch.__file__))')"
OUT="$ROOT/build/fuzz"
mkdir -p "$OUT/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address -D_GLIBCXX_USE_CXX11_ABI=1 \
  -I "$ROOT/include" -I "$ROOT/src" -isystem "$TORCH/include" \
  "$ROOT/fuzz/safetensors_fuzzer.cpp" "$ROOT/src/checkpoint/safetensors_reader.cpp" \
  "$ROOT/src/checkpoint/safetensors_header.cpp" "$ROOT/src/checkpoint/dtypes.cpp" \
  -L "$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -ltorch_cpu -lc10 -o "$OUT/safetensors_fuzzer"
# Seed the corpus with a valid file so the fuzzer starts from the format's real shape.
"$ROOT/.venv/bin/python" - "$OUT/corpus/seed.safetensors" <<'PY'
import sys, torch
from safetensors.torch import save_file
save_file({"w": torch.arange(6.0).view(2, 3), "i": torch.arange(3), "h": torch.ones(2, dtype=torch.bfloat16)},
          sys.argv[1], metadata={"format": "pt"})
PY
ASAN_OPTIONS=detect_leaks=0 "$OUT/safetensors_fuzzer" -runs="$RUNS" -max_len=4096 -print_final_stats=1 "$OUT/corpus"
