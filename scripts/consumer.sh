#!/usr/bin/env bash
# Builds and runs tests/consumer (LibTorch apps using find_package(torchspeed)) three times: against
# the pip-installed package (torchspeed.cmake_prefix_path), against `cmake --install` of the C++
# build, and against the build tree itself (export()); no Python is involved in finding the last
# two. Then tests/consumer_subdir embeds torchspeed with add_subdirectory (checking that it leaves
# the parent's settings alone), and examples/cpp is built against the pip install and its training
# example run. LD_LIBRARY_PATH is unset throughout: every binary must find its libraries through
# RUNPATHs, as on a user's machine.
set -euo pipefail
cd "$(dirname "$0")/.."
unset LD_LIBRARY_PATH
PY=${PYTHON:-python3}
TORCH_CMAKE=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
TORCH_LIB=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
WHEEL_CMAKE=$(cd /tmp && "$PY" -c 'import torchspeed; print(torchspeed.cmake_prefix_path)')
WHEEL_LIB=$(cd /tmp && "$PY" -c 'import os, torchspeed; print(os.path.join(os.path.dirname(torchspeed.__file__), "lib"))')
fail() { echo "FAILED: $*"; exit 1; }
check_library() {  # libdir: libtorchspeed resolves every library it needs through its own RUNPATH
  local lib=$1/libtorchspeed.so missing
  readelf -d "$lib" | grep -E 'R(UN)?PATH' || fail "$lib has no RUNPATH"
  missing=$(ldd "$lib" | grep 'not found' || true)
  [ -z "$missing" ] || fail "$lib does not find:"$'\n'"$missing"
}
check_openmp() {  # app: when torch ships its libgomp, the app loads that one (one OpenMP runtime)
  [ -e "$TORCH_LIB/libgomp.so.1" ] || return 0
  local got
  got=$(ldd "$1" | awk '$1 == "libgomp.so.1" {print $3}')
  [ "$(readlink -f "$got")" = "$(readlink -f "$TORCH_LIB/libgomp.so.1")" ] ||
    fail "$1 loads libgomp.so.1 from '$got', not torch's $TORCH_LIB/libgomp.so.1"
}
data=$(cd /tmp && "$PY" -c 'import torchspeed._C as C; print("ON" if hasattr(C, "data") else "OFF")')
run_consumer() {  # name prefix_path libdir
  local dir=build/consumer-$1
  check_library "$3"
  rm -rf "$dir"
  cmake -S tests/consumer -B "$dir" -G Ninja -DCMAKE_PREFIX_PATH="$2;$TORCH_CMAKE" \
    -DEXPECT_WITH_DATA="$data" >"$dir.log" 2>&1 || { cat "$dir.log"; return 1; }
  cmake --build "$dir" >>"$dir.log" 2>&1 || { cat "$dir.log"; return 1; }
  "$dir/minimal_app"
  (cd "$dir" && ./consumer)  # it writes consumer_trace.json where it runs
  "$dir/dlopen_app"
  check_openmp "$dir/minimal_app"
}
echo "consumer against the pip install ($WHEEL_CMAKE):"
run_consumer wheel "$WHEEL_CMAKE" "$WHEEL_LIB"
BUILD=${TORCHSPEED_BUILD_DIR:-build/release}
cmake --install "$BUILD" --prefix "$PWD/build/cpp-install" >/dev/null
echo "consumer against cmake --install ($PWD/build/cpp-install):"
run_consumer install "$PWD/build/cpp-install/share/cmake" "$PWD/build/cpp-install/lib"
echo "consumer against the build tree ($PWD/$BUILD):"
run_consumer build-tree "$PWD/$BUILD" "$PWD/$BUILD"

echo "add_subdirectory(torchspeed) in another project (no Python module, no data area):"
sub=build/consumer-subdir
rm -rf "$sub" "$sub-install"
cmake -S tests/consumer_subdir -B "$sub" -G Ninja -DTORCHSPEED_SOURCE_DIR="$PWD" \
  -DCMAKE_PREFIX_PATH="$TORCH_CMAKE" -DTORCHSPEED_BUILD_PYTHON=OFF -DTORCHSPEED_WITH_DATA=OFF \
  -DEXPECT_WITH_DATA=OFF ${CMAKE_ARGS:-} >"$sub.log" 2>&1 || { cat "$sub.log"; exit 1; }
cmake --build "$sub" >>"$sub.log" 2>&1 || { tail -50 "$sub.log"; exit 1; }
"$sub/minimal_app"
tests=$(cd "$sub" && ctest -N | awk '/Total Tests:/ {print $3}')
[ "$tests" = 1 ] || fail "the parent project has $tests tests; torchspeed must add none when embedded"
cmake --install "$sub" --prefix "$PWD/$sub-install" >/dev/null
[ -z "$(ls -A "$sub-install" 2>/dev/null)" ] || fail "an embedded torchspeed installed files: $(ls -R "$sub-install" | head)"

echo "examples/cpp against the pip install:"
rm -rf build/examples
cmake -S examples/cpp -B build/examples -G Ninja -DCMAKE_PREFIX_PATH="$WHEEL_CMAKE;$TORCH_CMAKE" \
  >build/examples.log 2>&1 || { cat build/examples.log; exit 1; }
cmake --build build/examples >>build/examples.log 2>&1 || { cat build/examples.log; exit 1; }
build/examples/train_mlp 200
check_openmp build/examples/train_mlp
if [ -x build/examples/train_loader ]; then
  # The loader + fused AdamW + profiler app on the demo's quick shards (generated once, cached).
  echo "examples/cpp/train_loader on torchspeed demo's quick shards:"
  demo_data="$PWD/build/demo-data"
  mapfile -t shards < <(cd /tmp && "$PY" -c 'import sys; from torchspeed.demo import dataset
m = dataset.prepare("quick", sys.argv[1], progress=False)
print("\n".join(m["train_urls"]))' "$demo_data")
  [ "${#shards[@]}" -gt 0 ] || fail "no demo shards for examples/cpp/train_loader"
  build/examples/train_loader 30 build/examples/train_loader_trace.json "${shards[@]}"
  "$PY" -c 'import json, sys; assert json.load(open(sys.argv[1]))["traceEvents"]' \
    build/examples/train_loader_trace.json
fi
if [ -x build/examples/ddp_train ]; then
  # The C++ and Python fronts of AccumulatingDDP on the same formulas: the same parameters.
  echo "examples/cpp/ddp_train and examples/python/ddp_accumulate.py under torchrun (2 ranks, Gloo):"
  run2=("$PY" -m torch.distributed.run --standalone --nproc-per-node 2)
  rm -f build/ddp_cpp.pt build/ddp_py.pt
  OMP_NUM_THREADS=1 timeout 300 "${run2[@]}" --no-python build/examples/ddp_train 6 3 build/ddp_cpp.pt
  OMP_NUM_THREADS=1 timeout 300 "${run2[@]}" examples/python/ddp_accumulate.py --steps 6 \
    --accumulation-steps 3 --save build/ddp_py.pt
  "$PY" - <<'PYEOF'
import torch
# Our own files: the C++ one is torch::pickle_save's tensor list (torch.load needs weights_only=False).
cpp = torch.load("build/ddp_cpp.pt", weights_only=False)
py = torch.load("build/ddp_py.pt")
assert len(cpp) == len(py) == 4, (len(cpp), len(py))
for a, b in zip(cpp, py):
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)  # float32: the same ops, both fronts
print("C++ and Python fronts: identical parameters within 1e-6 after 6 steps x 3 micro-steps")
PYEOF
fi
