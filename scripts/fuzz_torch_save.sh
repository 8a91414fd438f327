#!/usr/bin/env bash
# Builds read_torch_save (our pickle machine + the torch.save globals) with clang's libFuzzer and
# AddressSanitizer and fuzzes the pickle inside a torch.save archive.
#   scripts/fuzz_torch_save.sh [RUNS]     (default 1,000,000 executions)
# Needs the set-up done (scripts/setup.sh); installs Debian's clang when missing (fuzz_common.sh).
set -euo pipefail
RUNS="${1:-1000000}"
source "$(dirname "${BASH_SOURCE[0]}")/fuzz_common.sh"
OUT="$ROOT/build/fuzz-torch-save"
mkdir -p "$OUT/corpus"
build_fuzzer "$OUT/torch_save_fuzzer" \
  "$ROOT/fuzz/torch_save_fuzzer.cpp" "$ROOT/src/checkpoint/torch_save.cpp" "$ROOT/src/checkpoint/pickle.cpp"
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
run_fuzzer "$OUT/torch_save_fuzzer" "$OUT/corpus" "$RUNS"
