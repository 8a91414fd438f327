#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then configures, builds and runs a consumer
# project that finds it with find_package(TorchBridge).
set -euo pipefail
build_dir="$1"; consumer_src="$2"
work="$build_dir/consumer-test"
rm -rf "$work"
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$consumer_src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
output="$("$work/build/consumer")"
echo "$output"
grep -q "^consumer ok: torchbridge " <<<"$output"

# A consumer whose toolchain links libstdc++ statically (emulated with -static-libstdc++; the GPU
# images' /opt/gcc does it on its own) still gets one C++ runtime per process, torch's: the
# installed package links it (cmake/OneCxxRuntime.cmake), so the program needs libstdc++.so.6 and
# carries no copy of it.
cmake -S "$consumer_src" -B "$work/static-toolchain" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ \
  -DCMAKE_SHARED_LINKER_FLAGS=-static-libstdc++ >"$work/static-toolchain.log"
grep "links libstdc++ statically into shared libraries and programs" "$work/static-toolchain.log"
cmake --build "$work/static-toolchain" >/dev/null
readelf -d "$work/static-toolchain/consumer" | grep 'NEEDED.*libstdc++\.so\.6' >/dev/null ||
  { echo "FAIL: the consumer built by a static toolchain does not need libstdc++.so.6"; exit 1; }
if nm "$work/static-toolchain/consumer" 2>/dev/null | grep ' T _ZNSt6locale7classicEv' >/dev/null; then
  echo "FAIL: the consumer built by a static toolchain carries its own libstdc++"; exit 1
fi
"$work/static-toolchain/consumer" | grep "^consumer ok: torchbridge " >/dev/null
echo "consumer built by a static toolchain: one C++ runtime (torch's)"
