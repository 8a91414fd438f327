# Shared by the fuzz_*.sh scripts (sourced, not run): clang when missing, torch's location, and
# the libFuzzer + AddressSanitizer build and run of one target.
# Needs the set-up done (scripts/setup.sh) for torch; installs Debian's clang and its sanitizer
# runtimes (compiler-rt, a package of its own in Debian 12) when missing.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v clang++ >/dev/null || [[ ! -f "$(clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ]]; then
  SUDO=""; [[ "$(id -u)" != 0 ]] && SUDO="sudo"
  CLANG_RT="libclang-rt-$(clang++ --version 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p')-dev"
  [[ "$CLANG_RT" == libclang-rt--dev ]] && CLANG_RT=libclang-rt-14-dev  # Debian 12's clang
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang "$CLANG_RT" >/dev/null
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
