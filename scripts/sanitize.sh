#!/usr/bin/env bash
# Builds the C++ library and tests with AddressSanitizer + UndefinedBehaviorSanitizer (no Python
# module) in build/asan and runs them under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_CMAKE=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
source scripts/ccache.sh  # a second run (or CI with a warm cache) recompiles only what changed
# -O1 -g1 (line tables only): what ASan recommends, full stack traces with file:line, and half the
# compile time of -O2 -g on these torch-heavy sources.
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTORCHSPEED_BUILD_PYTHON=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DTORCHSPEED_BUILD_TESTS=ON -DTORCHSPEED_SANITIZE=address,undefined -DTORCHSPEED_WITH_CUDA=OFF \
  -DTORCHSPEED_WITH_DATA=${TORCHSPEED_WITH_DATA:-ON} -DCMAKE_PREFIX_PATH="$TORCH_CMAKE" "${CCACHE_LAUNCHER[@]}" >build/asan-configure.log
# The build log stays in a file (the sanitizer build's -O1 brings gcc's false-positive
# -Wmaybe-uninitialized warnings from libstdc++); its tail is printed if the build fails.
if ! cmake --build build/asan -j "${MAX_JOBS:-$(nproc)}" >build/asan-build.log 2>&1; then
  tail -80 build/asan-build.log
  echo "sanitize.sh: build failed (full log: build/asan-build.log)"
  exit 1
fi
# libtorch itself is not built with ASan; its one-time global allocations are not ours to report,
# so leak detection stays on only for what the suppressions file does not name.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_odr_violation=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir build/asan --output-on-failure
