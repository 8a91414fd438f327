#!/usr/bin/env bash
# The minimal device builds the way a vendor who copied it builds it: its own CMake project, with
# nothing of TorchBridge but the header directory, and exports exactly tb_runtime_entry.
# usage: minimal_device_standalone.sh SOURCE_DIR INCLUDE_DIR
set -euo pipefail
source_dir=$1
include_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Only the header travels: a copy of runtime.h alone, so nothing else of the tree can be reached.
mkdir -p "$work/include/torchbridge/sdk"
cp "$include_dir/torchbridge/sdk/runtime.h" "$work/include/torchbridge/sdk/"
cp -r "$source_dir" "$work/minimal_device"
cmake -S "$work/minimal_device" -B "$work/build" -DTORCHBRIDGE_SDK_INCLUDE_DIR="$work/include" \
      -DCMAKE_C_FLAGS="-Werror" > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
library="$work/build/libtorchbridge_device_minimal.so"
exported=$(nm -D --defined-only "$library" | awk '$2 == "T" {print $3}')
if [ "$exported" != "tb_runtime_entry" ]; then
  echo "expected the library to export exactly tb_runtime_entry; it exports: $exported" >&2
  exit 1
fi
echo "built $library standalone; exports: $exported"
