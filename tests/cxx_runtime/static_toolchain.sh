#!/usr/bin/env bash
# cmake/OneCxxRuntime.cmake against a toolchain that links libstdc++ statically into shared
# libraries (emulated with -static-libstdc++, which is what the GPU images' /opt/gcc does on its
# own). With the module, the fixture library needs torch's libstdc++.so.6, holds no copy of the
# runtime, and computes right beside torch; without it (the control), the same library holds a
# copy and goes wrong beside torch, which shows the fixture reproduces the defect.
#
#   static_toolchain.sh SOURCE_DIR PYTHON WORK_DIR
set -euo pipefail
source_dir="$1"; python="$2"; work="$3"
fixture="$source_dir/tests/cxx_runtime"
c10="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))')"
rm -rf "$work"; mkdir -p "$work"
for mode in ON OFF; do
  cmake -S "$fixture" -B "$work/$mode" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_SHARED_LINKER_FLAGS=-static-libstdc++ \
        -DUSE_TORCHS_RUNTIME="$mode" -DTORCH_LIBRARY="$c10" -DTORCHBRIDGE_SOURCE_DIR="$source_dir" >"$work/configure-$mode.log"
  cmake --build "$work/$mode" >"$work/build-$mode.log"
done
grep "libstdc++ statically" "$work/configure-ON.log"

fixed="$work/ON/libformatting.so" control="$work/OFF/libformatting.so"
readelf -d "$fixed" | grep 'NEEDED.*libstdc++\.so\.6' >/dev/null || { echo "FAIL: $fixed does not need libstdc++.so.6"; exit 1; }
if nm -D --defined-only "$fixed" | grep '_ZNSt6locale7classicEv' >/dev/null; then
  echo "FAIL: $fixed defines std::locale::classic(): it carries its own C++ runtime"; exit 1
fi
"$python" "$fixture/check_formatting.py" "$fixed" || { echo "FAIL: the library built with the module went wrong beside torch"; exit 1; }

nm -D --defined-only "$control" | grep '_ZNSt6locale7classicEv' >/dev/null ||
  { echo "FAIL: the control carries no C++ runtime: -static-libstdc++ did not take effect"; exit 1; }
if "$python" "$fixture/check_formatting.py" "$control"; then
  echo "FAIL: the control (a copy of libstdc++ beside torch's) computed right: the fixture no longer shows the defect"
  exit 1
fi
echo "PASS: with the module one C++ runtime (torch's); without it, the copy goes wrong beside torch"
