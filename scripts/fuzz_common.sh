# Shared by the fuzz_*.sh scripts (sourced, not run): clang when missing, torch's location, and
# the libFuzzer + AddressSanitizer build and run of one target.
# Needs the set-up done (scripts/setup.sh) for torch; installs Debian's clang when missing.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v clang++ >/dev/null; then
  SUDO=""; [[ "$(id -u)" != 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang >/dev/null
fi
TORCH="$("$ROOT/.venv/bin/python" -c 'import torch, os; print(os.path.dirname(torch.__file__))')"

# build_fuzzer OUTPUT SOURCE... : only our sources are instrumented; libtorch is linked as built.
build_fuzzer() {
  local output="$1"
  shift
  clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address -D_GLIBCXX_USE_CXX11_ABI=1 \
    -I "$ROOT/include" -I "$ROOT/src" -isystem "$TORCH/include" "$@" \
    -L "$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -ltorch_cpu -lc10 -o "$output"
}

# run_fuzzer BINARY CORPUS RUNS
run_fuzzer() {
  ASAN_OPTIONS=detect_leaks=0 "$1" -runs="$3" -max_len=4096 -print_final_stats=1 "$2"
}
