#!/usr/bin/env bash
# Runs every torchspeed test on this machine: installs what is missing, builds, then C++ tests
# (ctest), Python tests (pytest), the find_package consumer app, one build per optional area
# turned OFF, the CUDA compile check, the ASan+UBSan C++ run, a short fuzz run and the format
# checks. Keeps going after a failed step and exits non-zero if any step failed.
# SKIP_SANITIZE=1 / SKIP_FUZZ=1 leave those out.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHON=${PYTHON:-python3}
bash scripts/install_deps.sh || exit 1
bash scripts/build.sh || exit 1

passed=0; failed=0; summary=()
step() {  # name command...
  local name=$1; shift
  local t0=$SECONDS
  echo; echo "=== $name: $*"
  if "$@"; then passed=$((passed + 1)); summary+=("PASS  $name ($((SECONDS - t0)) s)")
  else failed=$((failed + 1)); summary+=("FAIL  $name ($((SECONDS - t0)) s)"); fi
}
step "C++ tests (ctest)" ctest --test-dir "${TORCHSPEED_BUILD_DIR:-build/release}" --output-on-failure
step "Python tests (pytest)" bash -c 'cd tests/python && "$PYTHON" -m pytest -q -rs -p no:cacheprovider --rootdir=../.. ../../tests/python'
step "find_package consumer" bash scripts/consumer.sh
step "area-OFF builds (one per optional area)" bash scripts/check_areas_off.sh
step "CUDA compile check (nvcc)" bash scripts/check_cuda_compile.sh
[ -n "${SKIP_SANITIZE:-}" ] || step "ASan+UBSan C++ tests" bash scripts/sanitize.sh
[ -n "${SKIP_FUZZ:-}" ] || { [ -f scripts/fuzz.sh ] && step "fuzz (short)" bash scripts/fuzz.sh 10; }
step "format (clang-format, ruff)" bash scripts/format.sh --check

echo; echo "=== summary"
printf '%s\n' "${summary[@]}"
echo "steps: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
