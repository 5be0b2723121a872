#!/usr/bin/env bash
# The one prepared GPU check (run from the repo root on the GPU machine, < 8 minutes, no network):
# build with CUDA, print build info, run the CUDA, optimizer, dist, profiler and loader tests and the benches, tee
# everything to $TORCHSPEED_RESULTS_DIR/gpu_check.log and end with a pass/fail table. A failed
# step does not stop the others; the exit status is non-zero if any step failed.
#   scripts/gpu_check.sh
#   TORCHSPEED_RESULTS_DIR=/tmp/out TORCHSPEED_CUDA_ARCH=90 scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

RESULTS="${TORCHSPEED_RESULTS_DIR:-./gpu_results}"
mkdir -p "$RESULTS"
RESULTS="$(cd "$RESULTS" && pwd)"
export TORCHSPEED_RESULTS_DIR="$RESULTS"  # the benches write their JSON here
LOG="$RESULTS/gpu_check.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

PYTHON="${PYTHON:-python}"
ARCH="${TORCHSPEED_CUDA_ARCH:-90}"
T0=$(date +%s)
declare -a NAMES=() STATUS=() SECONDS_TAKEN=()
FAILED=0

BUDGET_S="${TORCHSPEED_GPU_CHECK_BUDGET_S:-460}"  # whole script, kept under 8 minutes

# step NAME TIMEOUT_S CMD... : runs CMD under `timeout` (capped by what is left of BUDGET_S),
# records pass/fail and wall time.
step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - T0)))
  if ((left < 10)); then
    NAMES+=("$name")
    STATUS+=("NOT RUN (time budget)")
    SECONDS_TAKEN+=(0)
    FAILED=1
    echo "==== [$name] not run: ${left}s left of the ${BUDGET_S}s budget"
    return 0
  fi
  ((limit > left)) && limit=$left
  echo
  echo "==== [$name] $* (timeout ${limit}s)"
  local start rc=0
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" || rc=$?
  local took=$(($(date +%s) - start))
  local status="pass"
  if ((rc == 124 || rc == 137)); then
    status="TIMEOUT"
  elif ((rc != 0)); then
    status="FAIL($rc)"
  fi
  [[ "$status" == "pass" ]] || FAILED=1
  NAMES+=("$name")
  STATUS+=("$status")
  SECONDS_TAKEN+=("$took")
  echo "==== [$name] $status in ${took}s"
}

skip() {
  NAMES+=("$1")
  STATUS+=("skipped: $2")
  SECONDS_TAKEN+=(0)
  echo "==== [$1] skipped: $2"
}

echo "==== torchspeed gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(pwd)"
nvidia-smi -L || echo "nvidia-smi -L failed"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
command -v nvcc >/dev/null && nvcc --version | tail -n 2 || echo "nvcc not on PATH"
cmake --version 2>/dev/null | head -n 1 || echo "cmake not on PATH"
"$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda, "| devices", torch.cuda.device_count())'

# ---- build ----------------------------------------------------------------------------------------
# TORCHSPEED_GPU_CMAKE_ARGS: extra -D options for this machine (e.g. -DTORCHSPEED_WITH_DATA=OFF).
build() {  # extra cmake args...
  local cmd=(env TORCHSPEED_WITH_CUDA=ON MAX_JOBS=16
    CMAKE_ARGS="-DTORCHSPEED_CUDA_ARCHITECTURES=$ARCH ${TORCHSPEED_GPU_CMAKE_ARGS:-} $*")
  if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    # No network on the GPU machine: --no-deps and no build isolation are required.
    "${cmd[@]}" "$PYTHON" -m pip install --no-build-isolation --no-deps -v -e .
  else
    "${cmd[@]}" "$PYTHON" setup.py develop
  fi
}
export -f build
export ARCH PYTHON
step build 180 bash -c 'build "$@"' build
if [[ "${STATUS[-1]}" != pass ]]; then
  # The GPU machine may lack libpng/libjpeg-turbo headers: the CUDA parts do not need the loader.
  step build_without_data 150 bash -c 'build "$@"' build -DTORCHSPEED_WITH_DATA=OFF
  [[ "${STATUS[-1]}" == pass ]] && FAILED=0 && STATUS[-2]="failed; retried without data"
fi

step info 20 "$PYTHON" -m torchspeed.info
step with_cuda 10 "$PYTHON" -c 'import torchspeed, sys; print("with_cuda =", torchspeed._C.with_cuda); sys.exit(0 if torchspeed._C.with_cuda else 1)'

# ---- tests ----------------------------------------------------------------------------------------
step test_cuda 90 "$PYTHON" -m pytest -q -rs tests/python/test_cuda.py
shopt -s nullglob
optim_tests=(tests/python/test_ops.py tests/python/optim/test_*.py)
if ((${#optim_tests[@]})); then
  # The CUDA variants of the tests written once per device (the `device` fixture); their CPU
  # variants run in CI. With them, the low-bit steps' CUDA-vs-CPU bitwise and graph-capture tests
  # (test_lowbit.py: Adam; test_lowbit_one_moment.py: Lion and SGD momentum).
  step test_ops_optim_cuda 120 "$PYTHON" -m pytest -q -rs -k cuda "${optim_tests[@]}"
else
  skip test_ops_optim "no tests/python/test_ops.py or tests/python/optim/test_*.py"
fi

# torchspeed.dist on the GPU: the CUDA bucket kernel against the CPU one, and AccumulatingDDP over a
# one-rank NCCL group (the multi-process Gloo tests run in CI).
step test_dist_cuda 90 "$PYTHON" -m pytest -q -rs tests/python/dist/test_ddp_cuda.py tests/python/dist/test_scale_cast_cuda.py

# int8 quantize/dequantize on the GPU (the `device` fixture's cuda variants) and their bench.
step test_quant_cuda 60 "$PYTHON" -m pytest -q -rs -k cuda tests/python/quant/test_affine.py
step bench_quant 60 "$PYTHON" -m torchspeed.cli bench quant --quick --device cuda
# The int8 Linear on CUDA (quantize_rows_int8 + int8_linear, bit-identical to the CPU kernels).
step test_int8_linear_cuda 60 "$PYTHON" -m pytest -q -rs -k cuda tests/python/quant/test_linear.py

# fake-quant on the GPU (the `device` fixture's cuda variants: bit for bit against torch), then the
# int8 Linear's CUDA kernels (kernels/cuda/quant_int8_linear.cu: row quantize + mma.sync int8 GEMM +
# fused epilogue) bit for bit against an int64 reference through torch.ops.torchspeed.int8_linear,
# and the int8 GEMM vs bf16 torch.matmul at 4096^3 (the full 8192^3 run: drop --quick).
step test_fake_quant_cuda 60 "$PYTHON" -m pytest -q -rs -k cuda tests/python/quant/test_fake_quant.py
step test_int8_linear_cuda_kernels 90 "$PYTHON" -m pytest -q -rs tests/python/quant/test_linear_cuda.py
step bench_int8_gemm_cuda 60 "$PYTHON" -m torchspeed.cli bench int8_gemm_cuda --quick

# Pruning on the GPU: the packed-mask ops (the `device` fixture's cuda variants) and the 2:4 export
# through torch's semi-structured sparse matmul (allclose to the dense masked matmul), and the bench.
step test_prune_cuda 60 "$PYTHON" -m pytest -q -rs -k cuda tests/python/prune
step bench_prune 60 "$PYTHON" -m torchspeed.cli bench prune --quick --device cuda

# A CUDA graph that captured opt.step() + sched.step() follows the LR schedule on replay.
step test_lr_scheduler_cuda 60 "$PYTHON" -m pytest -q -rs -k "cuda or graph" tests/python/optim/test_lr_scheduler.py tests/python/test_checkpoint.py

# The profiler's CUDA-event timeline against kernels of known duration, no sync inside a step, NVTX.
step test_profile_cuda 60 "$PYTHON" -m pytest -q -rs tests/python/profile/test_step_profiler_cuda.py

# ---- benches (JSON into $TORCHSPEED_RESULTS_DIR) ---------------------------------------------------
# The benchmarks ship in the package (torchspeed.benchmarks); `torchspeed bench NAME` runs one.
step bench_grad_stats 30 "$PYTHON" -m torchspeed.cli bench grad_stats --device cuda
step bench_optim 60 "$PYTHON" -m torchspeed.cli bench optim --device cuda --state-dtype fp32
# Low-bit moments on CUDA: one flat 1e9-element fp32 param, bf16 / int8 state (20 / 16 B per param)
# against torch fused AdamW and fp32 state, as a fraction of the device copy bandwidth (frac_of_bw).
step bench_optim_lowbit 60 "$PYTHON" -m torchspeed.cli bench optim --device cuda --sets flat \
  --state-dtype fp32,bf16,int8
# Lion and SGD momentum with fp32 / bf16 / int8 state on a flat 20M param (--quick), torch SGD
# beside (bench_optim_lion_sgd_cuda.json, next to the AdamW runs' bench_optim_cuda.json).
step bench_optim_lowbit_one_moment 40 "$PYTHON" -m torchspeed.cli bench optim --device cuda \
  --sets flat --quick --optimizers lion,sgd --state-dtype fp32,bf16,int8
step bench_profile 60 "$PYTHON" -m torchspeed.cli bench profile --quick

# ---- loader on the GPU (only when the data part was built) -----------------------------------------
if "$PYTHON" -c 'import sys, torchspeed._C as C; sys.exit(0 if hasattr(C, "data") else 1)'; then
  step test_data_cuda 60 "$PYTHON" -m pytest -q -rs tests/python/data/test_loader.py
  step bench_loader_gpu 90 "$PYTHON" -m torchspeed.cli bench loader_gpu --batches 100 --step-ms 20
else
  skip test_data_cuda "built without the data part (TORCHSPEED_WITH_DATA=OFF)"
  skip bench_loader_gpu "built without the data part (TORCHSPEED_WITH_DATA=OFF)"
fi

# ---- the end-to-end demo on the GPU: torch's DataLoader + PIL + torch AdamW vs torchspeed's loader
# (uint8 batches prefetched on a side stream, normalized on the GPU) + fused AdamW, fp16 autocast +
# GradScaler in both, plus the doctor's fixes (channels_last, cudnn.benchmark). First run generates
# the dataset (~10,000 JPEGs, cached in ~/.cache/torchspeed). Writes summary.json, demo.png, traces.
if "$PYTHON" -c 'import sys, torchspeed._C as C; sys.exit(0 if hasattr(C, "data") else 1)'; then
  step demo_cuda 420 "$PYTHON" -m torchspeed.cli demo --device cuda --steps 400 --batch-size 128 \
    --image-size 64 --with-doctor-fixes --no-progress --out "$RESULTS/demo_cuda"
else
  skip demo_cuda "built without the data part (TORCHSPEED_WITH_DATA=OFF)"
fi

# ---- summary --------------------------------------------------------------------------------------
echo
echo "==== summary (total $(($(date +%s) - T0))s, log $LOG)"
printf '%-18s %-22s %8s\n' step result seconds
for i in "${!NAMES[@]}"; do
  printf '%-18s %-22s %8s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECONDS_TAKEN[$i]}"
done
if ((FAILED)); then
  echo "gpu_check: FAILED"
  exit 1
fi
echo "gpu_check: all passed"
