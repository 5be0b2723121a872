// CPU implementation of torchspeed::int8_pack_weight and int8_linear: validates (shapes, the
// weight's range, the packed buffer's header against the running int8 path), then runs the ISA
// table's int8 kernels (kernels/cpu/quant_int8_gemm.h): per-row quantization of x in parallel over
// rows, then the GEMM in parallel over blocks of rows x output channels.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/cpu/dispatch.h"
#include "ops/quant_checks.h"

namespace torchspeed::ops {
namespace {

namespace kc = kernels::cpu;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

const char* path_name(int32_t path) {
  switch (static_cast<kc::Int8Path>(path)) {
    case kc::Int8Path::kScalar:
      return "scalar";
    case kc::Int8Path::kAvx2:
      return "avx2";
    case kc::Int8Path::kAvx512:
      return "avx512";
    case kc::Int8Path::kAvx512Vnni:
      return "avx512_vnni";
    case kc::Int8Path::kAmx:
      return "amx";
  }
  return "unknown";
}

at::Tensor int8_pack_weight_cpu(const Int8PackWeightArgs& a) {
  const char* op = Int8PackWeightArgs::kName;
  validate(a);
  const auto& k8 = rethrow_as_torch_error(op, [] { return &kc::cpu_kernels(); })->quant.int8_linear;
  const int64_t n = a.w.size(0), k = a.w.size(1);
  const int8_t* w = a.w.data_ptr<int8_t>();
  for (int64_t i = 0; i < n * k; ++i) {
    TORCH_CHECK(w[i] != -128, "torchspeed.", op,
                ": w must be in [-127, 127] (symmetric), got -128 at [", i / k, ", ", i % k, "]");
  }
  const int64_t n_pad = round_up(n, kc::kInt8PanelN), k_pad = round_up(k, kc::kInt8KAlign);
  at::Tensor out =
      at::empty({int8_packed_bytes(n, k).expect_int()}, a.w.options().dtype(at::kByte));
  kc::Int8PackedHeader h{};
  h.magic = kc::kInt8PackedMagic;
  h.version = kc::kInt8PackedVersion;
  h.path = static_cast<int32_t>(k8.path);
  h.n = n;
  h.k = k;
  h.n_pad = n_pad;
  h.k_pad = k_pad;
  static_assert(sizeof(h) == 64, "the packed header is 64 bytes");
  uint8_t* p = out.data_ptr<uint8_t>();
  std::memcpy(p, &h, sizeof(h));
  k8.pack_weight(w, n, k, n_pad, k_pad, p + sizeof(h));
  return out;
}

at::Tensor int8_linear_cpu(const Int8LinearArgs& a) {
  const char* op = Int8LinearArgs::kName;
  const SymInt8LinearShape s = validate(a);
  TORCH_CHECK(s.packed, "torchspeed.", op,
              ": on CPU packed_w must be int8_pack_weight's uint8 buffer, got an int8 weight "
              "(pack it once with torchspeed.quant.int8_pack_weight)");
  const int64_t m = s.m.expect_int(), n = s.n.expect_int(), k = s.k.expect_int();
  const auto& k8 = rethrow_as_torch_error(op, [] { return &kc::cpu_kernels(); })->quant.int8_linear;
  kc::Int8PackedHeader h;
  std::memcpy(&h, a.packed_w.data_ptr<uint8_t>(), sizeof(h));
  TORCH_CHECK(h.magic == kc::kInt8PackedMagic && h.version == kc::kInt8PackedVersion, "torchspeed.",
              op, ": packed_w is not an int8_pack_weight buffer (bad header)");
  TORCH_CHECK(h.n == n && h.k == k && h.n_pad == round_up(n, kc::kInt8PanelN) &&
                  h.k_pad == round_up(k, kc::kInt8KAlign),
              "torchspeed.", op, ": packed_w was packed for N = ", h.n, ", K = ", h.k,
              ", got N = ", n, " (w_scale), K = ", k, " (x)");
  TORCH_CHECK(h.path == static_cast<int32_t>(k8.path), "torchspeed.", op,
              ": packed_w was packed for the int8 path '", path_name(h.path),
              "' but the current one is '", k8.name,
              "' (TORCHSPEED_CPU_ISA changed?): repack the int8 weight with int8_pack_weight");
  std::vector<int64_t> shape(a.x.sizes().begin(), a.x.sizes().end());
  shape.back() = n;
  at::Tensor out = at::empty(shape, a.x.options());
  if (m == 0) return out;

  const int64_t k_pad = h.k_pad;
  // Quantized rows one cache line longer than K_pad: rows 4 KiB apart would alias in L1 (the
  // microkernels read 8 to 32 rows at once).
  const int64_t lda = k_pad + kc::kInt8KAlign;
  at::Tensor q = at::empty({m, lda}, a.x.options().dtype(at::kChar));
  at::Tensor x_scale = at::empty({m}, a.x.options().dtype(at::kFloat));
  const auto dtype = kernel_dtype(a.x.scalar_type());
  const char* x = static_cast<const char*>(a.x.data_ptr());
  const int64_t row_bytes = k * a.x.element_size();
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = x_scale.data_ptr<float>();
  std::atomic<bool> ok{true};
  at::parallel_for(0, m, std::max<int64_t>(1, 32768 / k), [&](int64_t b, int64_t e) {
    if (!k8.quantize_rows(dtype, x + b * row_bytes, e - b, k, qp + b * lda, lda, sp + b)) {
      ok = false;
    }
  });
  TORCH_INTERNAL_ASSERT(ok, "torchspeed.", op, ": the validator let through ", a.x.scalar_type());

  kc::Int8GemmArgs g{};
  g.a = qp;
  g.lda = lda;
  g.a_scale = sp;
  g.packed = a.packed_w.data_ptr<uint8_t>() + sizeof(h);
  g.w_scale = a.w_scale.data_ptr<float>();
  g.bias = a.bias ? a.bias->data_ptr<float>() : nullptr;
  g.relu = a.relu;
  g.out_dtype = kernel_dtype(a.x.scalar_type());
  g.out = out.data_ptr();
  g.ldo = n;
  g.m = m;
  g.n = n;
  g.k = k;
  g.n_pad = h.n_pad;
  g.k_pad = k_pad;

  // Blocks: columns in multiples of 96 (3 VNNI panels, 3 AMX tile pairs) holding about 512 KiB of
  // panels (the block stays in L2 while its rows stream), rows by 128; smaller column blocks when
  // there are too few blocks for the threads.
  constexpr int64_t kColStep = 96, kRowBlock = 128;
  const int64_t threads = at::get_num_threads();
  int64_t nb = std::max<int64_t>(kColStep, (int64_t{512} * 1024 / k_pad) / kColStep * kColStep);
  nb = std::min(nb, round_up(n, kColStep));
  const int64_t mb = std::min<int64_t>(kRowBlock, m);
  const int64_t m_blocks = (m + mb - 1) / mb;
  while (nb > kColStep && m_blocks * ((n + nb - 1) / nb) < 4 * threads) nb -= kColStep;
  // Even column blocks (whole panels): parallel_for gives each thread the same count of tasks, so
  // a narrow last block would idle a thread (N = 1024 as 480 + 480 + 64 ran 25% slower on 2).
  const int64_t even = (n + nb - 1) / nb;
  nb = round_up((n + even - 1) / even, kc::kInt8PanelN);
  const int64_t n_blocks = (n + nb - 1) / nb;
  // Column block outermost: a thread's consecutive tasks share their panels.
  at::parallel_for(0, m_blocks * n_blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t nbi = t / m_blocks, mbi = t % m_blocks;
      const int64_t n0 = nbi * nb, m0 = mbi * mb;
      k8.gemm(g, m0, std::min(m, m0 + mb), n0, std::min(n, n0 + nb));
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CPU, m) {
  TORCHSPEED_OP_IMPL(m, Int8PackWeightArgs, int8_pack_weight_cpu);
  TORCHSPEED_OP_IMPL(m, Int8LinearArgs, int8_linear_cpu);
}

}  // namespace torchspeed::ops

namespace torchspeed {

std::string cpu_int8_path() {
  return ops::rethrow_as_torch_error("cpu_int8_path", [] {
    return std::string(kernels::cpu::cpu_kernels().quant.int8_linear.name);
  });
}

std::string cpu_amx_status() { return kernels::cpu::amx_status(); }

}  // namespace torchspeed
