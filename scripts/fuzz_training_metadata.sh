#!/usr/bin/env bash
# Builds the training state's metadata reader (read_training_metadata and the optimizer codecs)
# with clang's libFuzzer and AddressSanitizer and fuzzes the `__metadata__` entries.
#   scripts/fuzz_training_metadata.sh [RUNS]     (default 1,000,000 executions)
# Needs the set-up done (scripts/setup.sh, for torch and build/lib/libtorchbridge.so); installs
# Debian's clang when missing (fuzz_common.sh).
set -euo pipefail
RUNS="${1:-1000000}"
source "$(dirname "${BASH_SOURCE[0]}")/fuzz_common.sh"
OUT="$ROOT/build/fuzz-training-metadata"
mkdir -p "$OUT/corpus"
# Only the metadata layer is instrumented; the rest of the library comes from libtorchbridge.
build_fuzzer "$OUT/training_metadata_fuzzer" \
  "$ROOT/fuzz/training_metadata_fuzzer.cpp" "$ROOT/src/checkpoint/training_metadata.cpp" \
  "$ROOT/src/checkpoint/optimizer_codec.cpp" "$ROOT/src/core/parse_integer.cpp" \
  -I "$ROOT/build/include" -isystem "$TORCH/include/torch/csrc/api/include" -L "$ROOT/build/lib" -Wl,-rpath,"$ROOT/build/lib" -ltorchbridge
# Seeds: the metadata of training states written by C++ (SGD, Adam, AdamW through the CLI's
# portability run writes Adam) and by Python's save_training_state (with an LR scheduler and a
# GradScaler: their JSON entries too), plus one optimizer entry alone.
"$ROOT/.venv/bin/python" - "$OUT/corpus" <<'PY'
import json, os, sys, tempfile
import torch
import torchbridge.checkpoint as tbc
from safetensors import safe_open
out = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
for name, make in (("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)), ("adam", torch.optim.Adam),
                   ("adamw", torch.optim.AdamW)):
    optimizer = make(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    path = os.path.join(tempfile.mkdtemp(), "state.safetensors")
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)  # its state holds infinities
    scaler = torch.amp.GradScaler("cpu")
    tbc.save_training_state(path, model, optimizer, scheduler, scaler, step=3, epoch=1, extra={"run": name})
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    with open(f"{out}/seed-{name}.json", "w") as seed:
        json.dump(metadata, seed)
    with open(f"{out}/seed-{name}-optimizer.json", "w") as seed:
        seed.write(metadata["torchbridge.optimizer"])
PY
run_fuzzer "$OUT/training_metadata_fuzzer" "$OUT/corpus" "$RUNS"
