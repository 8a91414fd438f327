#!/usr/bin/env bash
# Builds read_torch_save (our pickle machine + the torch.save globals) with clang's libFuzzer and
# AddressSanitizer and fuzzes the pickle inside a torch.save archive.
#   scripts/fuzz_torch_save.sh [RUNS]     (default 1,000,000 executions)
# Needs the set-up done (scripts/setup.sh) for torch; installs Debian's clang when missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${1:-1000000}"
if ! command -v clang++ >/dev/null; then
  SUDO=""; [[ "$(id -u)" != 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang >/dev/null
fi
TORCH="$("$ROOT/.venv/bin/python" -c 'import torch, os; print(os.path.dirname(torch.__file__))')"
OUT="$ROOT/build/fuzz-torch-save"
mkdir -p "$OUT/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address -D_GLIBCXX_USE_CXX11_ABI=1 \
  -I "$ROOT/include" -I "$ROOT/src" -isystem "$TORCH/include" \
  "$ROOT/fuzz/torch_save_fuzzer.cpp" "$ROOT/src/checkpoint/torch_save.cpp" "$ROOT/src/checkpoint/pickle.cpp" \
  -L "$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -ltorch_cpu -lc10 -o "$OUT/torch_save_fuzzer"
# Seeds: the data.pkl of real torch.save files (protocols 2 and 4) whose storages are the 64-byte
# records data/0..3 the fuzzer provides: an OrderedDict state dict with a strided view sharing a
# storage, a parameter, bf16 and int64, an untyped-storage dtype (_rebuild_tensor_v3), nesting.
"$ROOT/.venv/bin/python" - "$OUT/corpus" <<'PY'
import collections, io, sys, zipfile
import torch
a = torch.arange(16.0)
state = collections.OrderedDict([("a", a), ("view", a.view(4, 4)[:, ::2]), ("h", torch.ones(32, dtype=torch.bfloat16)),
                                 ("p", torch.nn.Parameter(torch.zeros(8, dtype=torch.int64).double())),
                                 ("nested", {"u": torch.zeros(32, dtype=torch.uint16)})])
for protocol in (2, 4):
    buffer = io.BytesIO()
    torch.save(state, buffer, pickle_protocol=protocol)
    with zipfile.ZipFile(buffer) as archive:
        pickle = next(archive.read(n) for n in archive.namelist() if n.endswith("data.pkl"))
    with open(f"{sys.argv[1]}/seed-protocol{protocol}.pkl", "wb") as out:
        out.write(pickle)
PY
ASAN_OPTIONS=detect_leaks=0 "$OUT/torch_save_fuzzer" -runs="$RUNS" -max_len=4096 -print_final_stats=1 "$OUT/corpus"
