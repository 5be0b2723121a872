#!/usr/bin/env bash
# Builds and runs tests/consumer (a LibTorch app using find_package(torchspeed)) twice: against
# the pip-installed package (torchspeed.cmake_prefix_path) and against `cmake --install` of the
# C++ build (no Python involved in finding it). Then builds examples/cpp against the pip install
# and runs the training example.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_CMAKE=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
WHEEL_CMAKE=$(cd /tmp && "$PY" -c 'import torchspeed; print(torchspeed.cmake_prefix_path)')
run_consumer() {  # name prefix_path
  local dir=build/consumer-$1
  rm -rf "$dir"
  cmake -S tests/consumer -B "$dir" -G Ninja -DCMAKE_PREFIX_PATH="$2;$TORCH_CMAKE" >"$dir.log" 2>&1 || { cat "$dir.log"; return 1; }
  cmake --build "$dir" >>"$dir.log" 2>&1 || { cat "$dir.log"; return 1; }
  "$dir/consumer"
}
echo "consumer against the pip install ($WHEEL_CMAKE):"
run_consumer wheel "$WHEEL_CMAKE"
BUILD=${TORCHSPEED_BUILD_DIR:-build/release}
cmake --install "$BUILD" --prefix "$PWD/build/cpp-install" >/dev/null
echo "consumer against cmake --install ($PWD/build/cpp-install):"
run_consumer install "$PWD/build/cpp-install/share/cmake"

echo "examples/cpp against the pip install:"
data=$(cd /tmp && "$PY" -c 'import torchspeed._C as C; print("ON" if hasattr(C, "data") else "OFF")')
rm -rf build/examples
cmake -S examples/cpp -B build/examples -G Ninja -DCMAKE_PREFIX_PATH="$WHEEL_CMAKE;$TORCH_CMAKE" \
  -DTORCHSPEED_EXAMPLES_DATA="$data" >build/examples.log 2>&1 || { cat build/examples.log; exit 1; }
cmake --build build/examples >>build/examples.log 2>&1 || { cat build/examples.log; exit 1; }
build/examples/train_mlp 200
