#!/usr/bin/env bash
# Compile-checks the CUDA code without a GPU: every csrc/kernels/cuda/*.cu with nvcc for sm_80 and
# sm_90 (warnings are errors); when the installed torch ships the ATen/c10 CUDA headers, a
# g++ -fsyntax-only pass over the op glue in csrc/ops/cuda/*.cpp; and a host build of
# csrc/kernels/cuda/optim_math.cuh compared bit for bit with the CPU template kernels/cpu/optim.h
# (every optimizer, every flag). Exits non-zero on any failure.
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
    obj="$tmp/$(basename "$src" .cu)_sm${arch}.o"
    log="$tmp/$(basename "$src" .cu)_sm${arch}.log"
    start=$(date +%s)
    if "$NVCC" -std=c++17 -O3 -arch="sm_${arch}" -Icsrc -Iinclude --expt-relaxed-constexpr \
        -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror -c "$src" -o "$obj" >"$log" 2>&1; then
      echo "ok    $src  sm_${arch}  ($(( $(date +%s) - start ))s)"
    else
      echo "FAIL  $src  sm_${arch}"
      sed 's/^/      /' "$log"
      failures=$((failures + 1))
    fi
  done
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
    log="$tmp/$(basename "$src").log"
    if "${CXX:-g++}" -std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -Werror \
        -isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include" \
        -isystem "$cuda_inc" -Icsrc -Iinclude -D_GLIBCXX_USE_CXX11_ABI="$abi" \
        -DTORCHSPEED_WITH_CUDA=1 -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE "$src" >"$log" 2>&1; then
      echo "ok    $src  (g++ -fsyntax-only)"
    else
      echo "FAIL  $src  (g++ -fsyntax-only)"
      sed 's/^/      /' "$log"
      failures=$((failures + 1))
    fi
  done
fi

# ---- optimizer math: host build of optim_math.cuh vs the CPU kernel template, bit for bit ----------
# (The lead may move this program to tests/cpp; it needs only g++ and the CUDA headers.)
if [[ -n "$cuda_inc" ]]; then
  cat >"$tmp/optim_math_vs_cpu.cpp" <<'CPP'
// One-off host check: kernels/cuda/optim_math.cuh (host build) vs kernels/cpu/optim.h (scalar ISA),
// bit for bit, over random elements and every flag combination.
#define TORCHSPEED_CPU_ISA_NAMESPACE isa_scalar
#include "kernels/cpu/optim.h"
#include "kernels/cuda/optim_math.cuh"
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
namespace cpu = torchspeed::kernels::cpu;
namespace cu = torchspeed::kernels::cuda;
using V = cpu::isa_scalar::ScalarVec<float>;
static bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; }
int fails = 0;
#define EXPECT_SAME(a, b, what) do { if (!same(a, b) && fails++ < 20) printf("MISMATCH %s: cpu %.9g cuda %.9g (algo %d cfg %d i %d)\n", what, (double)(a), (double)(b), algo, cfg, i); } while (0)

int main() {
  std::mt19937 rng(123);
  std::normal_distribution<float> nd;
  const int n = 4096;
  for (int algo = 0; algo < 4; ++algo) {
    for (int cfg = 0; cfg < 64; ++cfg) {
      const bool b0 = cfg & 1, b1 = cfg & 2, b2 = cfg & 4, b3 = cfg & 8, b4 = cfg & 16, b5 = cfg & 32;
      const double lr = b5 ? 0.37 : 1e-3, beta1 = 0.9, beta2 = b4 ? 0.95 : 0.999, eps = b3 ? 0.0 : 1e-8;
      const double wd = b0 ? 0.1 : 0.0, ema_decay = 0.9, momentum = b1 ? 0.9 : 0.0, dampening = b2 ? 0.1 : 0.0;
      const float scale = b4 ? 1024.f : 1.f, clip = b5 ? 0.3f : 1.f, step_before = float(cfg % 7);
      // --- CPU op's host-side scalars (ops/cpu/optim_cpu.cpp) ---
      cpu::OptimScalars s{};
      s.weight_decay = float(wd); s.beta1 = float(beta1); s.beta2 = float(beta2);
      s.one_minus_beta1 = float(1.0 - beta1); s.one_minus_beta2 = float(1.0 - beta2); s.eps = float(eps);
      s.momentum = float(momentum); s.one_minus_dampening = float(1.0 - dampening);
      s.amsgrad = b1; s.maximize = b2; s.decoupled_weight_decay = b3; s.nesterov = b1 && !b2 && b3; s.first_step = b4 && b1;
      const float inv_scale = float(1.0 / double(scale));
      s.grad_scale = inv_scale * clip; s.lr = float(lr); s.param_decay = float(1.0 - lr * s.weight_decay);
      s.ema_decay = float(ema_decay); s.one_minus_ema_decay = float(1.0 - ema_decay);
      float stepf = step_before; stepf += 1;  // steps[i].add_(1)
      const double step = stepf, bc1 = 1.0 - std::pow(beta1, step), bc2 = 1.0 - std::pow(beta2, step);
      s.bias_correction1 = float(bc1); s.bias_correction2 = float(bc2); s.bias_correction2_sqrt = float(std::sqrt(bc2)); s.step_size = float(lr / bc1);
      // --- CUDA glue's hyper (ops/cuda/optim_cuda.cpp) ---
      cu::OptimHyper h{};
      h.lr = lr; h.weight_decay = float(wd); h.one_minus_ema_decay = float(1.0 - ema_decay);
      h.beta1 = beta1; h.beta2 = beta2; h.beta2_f = float(beta2); h.one_minus_beta1 = float(1.0 - beta1); h.one_minus_beta2 = float(1.0 - beta2);
      h.eps = float(eps); h.momentum = float(momentum); h.one_minus_dampening = float(1.0 - dampening);
      h.amsgrad = s.amsgrad; h.maximize = s.maximize; h.decoupled_weight_decay = s.decoupled_weight_decay; h.nesterov = s.nesterov; h.first_step = s.first_step;
      const bool has_step = algo != 1;
      cu::BlockScalars bs = cu::block_scalars(h, lr, scale, clip, has_step, stepf, false, 0, 0);
      int i = -1;
      EXPECT_SAME(s.grad_scale, bs.grad_scale, "grad_scale"); EXPECT_SAME(s.param_decay, bs.param_decay, "param_decay");
      if (has_step) { EXPECT_SAME(s.step_size, bs.step_size, "step_size"); EXPECT_SAME(s.bias_correction2_sqrt, bs.bias_correction2_sqrt, "bc2sqrt"); EXPECT_SAME(s.bias_correction1, bs.bias_correction1, "bc1"); EXPECT_SAME(s.bias_correction2, bs.bias_correction2, "bc2"); }
      // --- data ---
      std::vector<float> p(n), g(n), m(n), v(n), vm(n), mask(n), ema(n);
      for (int k = 0; k < n; ++k) {
        p[k] = nd(rng); g[k] = nd(rng) * (k % 5 == 0 ? 1e-3f : 1.f) * scale; m[k] = nd(rng) * 0.1f; v[k] = std::fabs(nd(rng)) * 0.01f;
        vm[k] = std::fabs(nd(rng)) * 0.01f; mask[k] = (k % 3) ? 1.f : 0.f; ema[k] = nd(rng);
        if (k % 97 == 0) g[k] = 0.f;
        if (k % 101 == 0) { m[k] = 0; v[k] = 0; }
      }
      auto P = p, G = g, M = m, Vv = v, VM = vm, E = ema;  // CPU copies
      cpu::OptimChunk c{P.data(), cpu::DType::kFloat, nullptr, G.data(), cpu::DType::kFloat, M.data(), Vv.data(), VM.data(),
                        b0 ? mask.data() : nullptr, b2 ? E.data() : nullptr, n};
      if (algo == 1 && momentum == 0) c.state0 = nullptr;
      double psq = 0, usq = 0;
      switch (algo) {
        case 0: cpu::isa_scalar::adam_range<V, float, float>(c, s); break;
        case 1: cpu::isa_scalar::sgd_range<V, float, float>(c, s); break;
        case 2: cpu::isa_scalar::lion_range<V, float, float>(c, s); break;
        case 3: {
          cpu::isa_scalar::lamb_phase1_range<V, float, float>(c, s, &psq, &usq);
          const double w = std::sqrt(psq), u = std::sqrt(usq);
          s.step_size = float(lr * ((w > 0 && u > 0) ? w / u : 1.0));
          cpu::isa_scalar::lamb_phase2_range<V, float, float>(c, s);
        } break;
      }
      // --- CUDA element math ---
      double cpsq = 0, cusq = 0;
      if (algo == 3) {
        for (i = 0; i < n; ++i) {
          float gg = cu::scale_grad(h, bs, g[i]);
          cu::lamb_moments(h, gg, m[i], v[i]);
          const float u = cu::lamb_update(h, bs, m[i], v[i], p[i]);
          cpsq += double(p[i]) * p[i]; cusq += double(u) * u;
        }
        if (std::fabs(cpsq - psq) > 1e-5 * psq || std::fabs(cusq - usq) > 1e-5 * usq) { printf("LAMB norms differ %g %g / %g %g\n", psq, cpsq, usq, cusq); fails++; }
        // use the CPU's sums so the phase-2 comparison isolates the element math
        bs = cu::block_scalars(h, lr, scale, clip, true, stepf, true, psq, usq);
        i = -1; EXPECT_SAME(s.step_size, bs.step_size, "lamb step_size");
      }
      for (i = 0; i < n; ++i) {
        float gg = algo == 3 ? 0.f : cu::scale_grad(h, bs, g[i]);
        switch (algo) {
          case 0: cu::adam_element(h, bs, gg, p[i], m[i], v[i], vm[i]); break;
          case 1: cu::sgd_element(h, bs, gg, p[i], m[i]); break;
          case 2: cu::lion_element(h, bs, gg, p[i], m[i]); break;
          case 3: p[i] = cu::lamb_apply(h, bs, m[i], v[i], p[i]); break;
        }
        if (b0) p[i] = cu::apply_mask(mask[i], p[i]);
        if (b2) ema[i] = cu::ema_update(h, p[i], ema[i]);
        EXPECT_SAME(P[i], p[i], "param");
        if (c.state0) EXPECT_SAME(M[i], m[i], "state0");
        if (algo == 0 || algo == 3) EXPECT_SAME(Vv[i], v[i], "state1");
        if (algo == 0 && h.amsgrad) EXPECT_SAME(VM[i], vm[i], "state2");
        if (b2) EXPECT_SAME(E[i], ema[i], "ema");
      }
    }
  }
  printf("%s: %d mismatches\n", fails ? "FAIL" : "ok", fails);
  return fails != 0;
}
CPP
  if "${CXX:-g++}" -std=c++17 -O2 -ffp-contract=off -Icsrc -isystem "$cuda_inc" \
      "$tmp/optim_math_vs_cpu.cpp" -o "$tmp/optim_math_vs_cpu" >"$tmp/eq.log" 2>&1 &&
      "$tmp/optim_math_vs_cpu" >>"$tmp/eq.log" 2>&1; then
    echo "ok    optim_math.cuh == kernels/cpu/optim.h bit for bit ($(tail -n 1 "$tmp/eq.log"))"
  else
    echo "FAIL  optim_math.cuh vs kernels/cpu/optim.h"
    sed 's/^/      /' "$tmp/eq.log" | tail -n 30
    failures=$((failures + 1))
  fi
else
  echo "skip  optimizer math check: cuda_runtime_api.h not found"
fi

if ((failures > 0)); then
  echo "check_cuda_compile: $failures failure(s)"
  exit 1
fi
echo "check_cuda_compile: all passed"
