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
