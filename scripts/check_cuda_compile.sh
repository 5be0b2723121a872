#!/usr/bin/env bash
# Compile-checks the CUDA code without a GPU: every csrc/kernels/cuda/*.cu with nvcc for sm_80 and
# sm_90 (warnings are errors); when the installed torch ships the ATen/c10 CUDA headers, a
# g++ -fsyntax-only pass over the op glue in csrc/ops/cuda/*.cpp, and over csrc/profile/nvtx.cpp
# with its CUDA branch on. Exits non-zero on any failure.
# (The element math of the CUDA kernels is also built for the host and compared bit for bit with
# the CPU kernels by ctest: tests/cpp/test_cuda_math_host.cpp.)
#   scripts/check_cuda_compile.sh            # from the repo root (or anywhere: it cd's there)
#   NVCC=/path/to/nvcc ARCHS="80 90" scripts/check_cuda_compile.sh
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${NVCC:-}" ]]; then
  NVCC="$(command -v nvcc || true)"
  [[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
fi
[[ -n "$NVCC" ]] && NVCC="$(command -v "$NVCC" || true)"  # NVCC=/missing/nvcc counts as absent
ARCHS="${ARCHS:-80 90}"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The compiles run MAX_JOBS at a time (default: the cores); results print in source order.
jobs_max="${MAX_JOBS:-$(nproc)}"
start_job() {  # id command...: runs in the background, leaving $tmp/id.{log,rc,secs}
  local id=$1
  shift
  while (($(jobs -rp | wc -l) >= jobs_max)); do wait -n || true; done
  (
    t0=$(date +%s)
    "$@" >"$tmp/$id.log" 2>&1
    echo $? >"$tmp/$id.rc"
    echo $(($(date +%s) - t0)) >"$tmp/$id.secs"
  ) &
}
report_job() {  # id label: prints ok or FAIL with the log, counts failures
  local id=$1 label=$2
  if [[ "$(cat "$tmp/$id.rc" 2>/dev/null)" == 0 ]]; then
    echo "ok    $label  ($(cat "$tmp/$id.secs")s)"
  else
    echo "FAIL  $label"
    sed 's/^/      /' "$tmp/$id.log"
    failures=$((failures + 1))
  fi
}

# ---- kernels: torch-free, nvcc only ---------------------------------------------------------------
if [[ -z "$NVCC" ]]; then
  echo "nvcc not found: CUDA compile check skipped"
  exit 0
fi
echo "nvcc: $("$NVCC" --version | tail -n 1)"
shopt -s nullglob
kernels=(csrc/kernels/cuda/*.cu)
if ((${#kernels[@]} == 0)); then
  echo "FAIL  no csrc/kernels/cuda/*.cu found"
  failures=$((failures + 1))
fi
for src in "${kernels[@]}"; do
  for arch in $ARCHS; do
    id="$(basename "$src" .cu)_sm${arch}"
    start_job "$id" "$NVCC" -std=c++17 -O3 -arch="sm_${arch}" -Icsrc -Iinclude \
      --expt-relaxed-constexpr -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror -c "$src" \
      -o "$tmp/$id.o"
  done
done
wait
for src in "${kernels[@]}"; do
  for arch in $ARCHS; do report_job "$(basename "$src" .cu)_sm${arch}" "$src  sm_${arch}"; done
done

# ---- op glue: host C++ against ATen's CUDA headers, syntax only ------------------------------------
PYTHON="${PYTHON:-python3}"
torch_dir="$("$PYTHON" -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)"
cuda_home="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
cuda_inc=""
for d in "$cuda_home/include" /usr/local/cuda/include; do
  [[ -f "$d/cuda_runtime_api.h" ]] && cuda_inc="$d" && break
done
glue=(csrc/ops/cuda/*.cpp)
if ((${#glue[@]} == 0)); then
  echo "skip  op glue: no csrc/ops/cuda/*.cpp"
elif [[ -z "$torch_dir" ]]; then
  echo "skip  op glue: torch is not importable with $PYTHON"
elif [[ ! -f "$torch_dir/include/ATen/cuda/CUDAContext.h" || ! -f "$torch_dir/include/c10/cuda/CUDAGuard.h" ]]; then
  echo "skip  op glue: this torch ($torch_dir) ships no ATen/cuda or c10/cuda headers"
elif [[ -z "$cuda_inc" ]]; then
  echo "skip  op glue: cuda_runtime_api.h not found next to $NVCC"
else
  # A CPU wheel lacks the generated c10/cuda/impl/cuda_cmake_macros.h (it only sets the export
  # macros); C10_CUDA_NO_CMAKE_CONFIGURE_FILE is c10's own switch to do without it.
  abi="$("$PYTHON" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)"
  for src in "${glue[@]}"; do
    start_job "glue_$(basename "$src")" "${CXX:-g++}" -std=c++17 -fsyntax-only -Wall -Wextra \
      -Wno-unused-parameter -Werror -isystem "$torch_dir/include" \
      -isystem "$torch_dir/include/torch/csrc/api/include" -isystem "$cuda_inc" -Icsrc -Iinclude \
      -D_GLIBCXX_USE_CXX11_ABI="$abi" -DTORCHSPEED_WITH_CUDA=1 -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE \
      "$src"
  done
  wait
  for src in "${glue[@]}"; do report_job "glue_$(basename "$src")" "$src  (g++ -fsyntax-only)"; done
fi

# ---- torch-free host code built only with CUDA (the profiler's NVTX mirror), syntax only --------
for src in csrc/profile/nvtx.cpp; do
  log="$tmp/$(basename "$src").log"
  if [[ -z "$cuda_inc" || ! -f "$cuda_inc/nvtx3/nvToolsExt.h" ]]; then
    echo "skip  $src: nvtx3/nvToolsExt.h not found next to $NVCC"
  elif "${CXX:-g++}" -std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -Werror \
      -isystem "$cuda_inc" -Icsrc -Iinclude -DTORCHSPEED_WITH_CUDA=1 "$src" >"$log" 2>&1; then
    echo "ok    $src  (g++ -fsyntax-only, TORCHSPEED_WITH_CUDA=1)"
  else
    echo "FAIL  $src  (g++ -fsyntax-only, TORCHSPEED_WITH_CUDA=1)"
    sed 's/^/      /' "$log"
    failures=$((failures + 1))
  fi
done

if ((failures > 0)); then
  echo "check_cuda_compile: $failures failure(s)"
  exit 1
fi
echo "check_cuda_compile: all passed"
