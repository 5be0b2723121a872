// The CUDA kernels' per-element math (kernels/cuda/optim_math.cuh, optim_lowbit_math.cuh,
// quant_math.cuh), built here for the host with -ffp-contract=off, against the CPU kernel templates
// (kernels/cpu/optim.h, quant.h, scalar lanes; the low-bit Adam, Lion and SGD against every ISA's
// kernel table, stochastic codes included), bit for bit: every optimizer and flag combination
// (both take their per-tensor scalars from the one step_scalars(), kernels/common/step_scalars.h,
// so this isolates the element math), fake-quant, and the int8 Linear's row scale, rounding and
// epilogue against api.cuh's formula. It runs without a GPU or the CUDA toolkit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "catch_shim.h"
#include "kernels/common/lowbit_codes.h"
#include "kernels/common/step_scalars.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/prune.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/optim_lowbit_math.cuh"
#include "kernels/cuda/optim_math.cuh"
#include "kernels/cuda/prune_math.cuh"
#include "kernels/cuda/quant_math.cuh"

namespace {

namespace k = torchspeed::kernels;
namespace cpu = torchspeed::kernels::cpu;
namespace cu = torchspeed::kernels::cuda;
using V = cpu::TORCHSPEED_CPU_ISA_NAMESPACE::ScalarVec<float>;

bool same(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof(float)) == 0;
}

struct Config {
  k::OptimAlgo algo;
  int flags;  // bit 0 weight decay + mask, 1 momentum/amsgrad, 2 dampening/maximize + EMA,
              // 3 eps 0 / decoupled, 4 beta2 0.95 + AMP scale, 5 large lr + clip
};

k::OptimHyper hyper_for(const Config& c) {
  const bool b0 = c.flags & 1, b1 = c.flags & 2, b2 = c.flags & 4, b3 = c.flags & 8,
             b4 = c.flags & 16, b5 = c.flags & 32;
  const double beta1 = 0.9, beta2 = b4 ? 0.95 : 0.999;
  k::OptimHyper h{};
  h.lr = b5 ? 0.37 : 1e-3;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.weight_decay = b0 ? 0.1f : 0.f;
  h.beta2_f = float(beta2);
  h.one_minus_beta1 = float(1.0 - beta1);
  h.one_minus_beta2 = float(1.0 - beta2);
  h.eps = b3 ? 0.f : 1e-8f;
  h.momentum = b1 ? 0.9f : 0.f;
  h.one_minus_dampening = float(1.0 - (b2 ? 0.1 : 0.0));
  h.one_minus_ema_decay = float(1.0 - 0.9);
  h.amsgrad = b1;
  h.maximize = b2;
  h.decoupled_weight_decay = b3;
  h.nesterov = b1 && !b2 && b3;
  h.first_step = b4 && b1;
  return h;
}

}  // namespace

TEST_CASE("CUDA element math equals the CPU kernels bit for bit, every optimizer and flag") {
  std::mt19937 rng(123);
  std::normal_distribution<float> nd;
  const int n = 4096;
  int mismatches = 0;
  for (k::OptimAlgo algo :
       {k::OptimAlgo::kAdam, k::OptimAlgo::kSgd, k::OptimAlgo::kLion, k::OptimAlgo::kLamb}) {
    for (int flags = 0; flags < 64; ++flags) {
      const Config cfg{algo, flags};
      const k::OptimHyper h = hyper_for(cfg);
      const bool with_mask = flags & 1, with_ema = flags & 4;
      const float scale = (flags & 16) ? 1024.f : 1.f, clip = (flags & 32) ? 0.3f : 1.f;
      const bool has_step = algo != k::OptimAlgo::kSgd;
      const float step = float(flags % 7) + 1.f;
      k::StepScalars s = k::step_scalars(h, h.lr, scale, clip, has_step, step);

      std::vector<float> p(n), g(n), m(n), v(n), vm(n), mask(n), ema(n);
      for (int i = 0; i < n; ++i) {
        p[i] = nd(rng);
        g[i] = nd(rng) * (i % 5 == 0 ? 1e-3f : 1.f) * scale;
        m[i] = nd(rng) * 0.1f;
        v[i] = std::fabs(nd(rng)) * 0.01f;
        vm[i] = std::fabs(nd(rng)) * 0.01f;
        mask[i] = (i % 3) ? 1.f : 0.f;
        ema[i] = nd(rng);
        if (i % 97 == 0) g[i] = 0.f;
        if (i % 101 == 0) m[i] = v[i] = 0.f;
      }
      std::vector<uint8_t> bits((n + 7) / 8, 0);  // the packed mask: bit i = element i
      for (int i = 0; i < n; ++i) {
        if (mask[i] != 0.f) bits[i / 8] |= uint8_t(1u << (i % 8));
      }
      auto P = p, M = m, Vv = v, VM = vm, E = ema;  // the CPU's copies
      k::OptimTensor t{};
      t.param = P.data();
      t.grad = g.data();
      t.exp_avg = (algo == k::OptimAlgo::kSgd && h.momentum == 0.f) ? nullptr : M.data();
      t.exp_avg_sq = Vv.data();
      t.max_exp_avg_sq = VM.data();
      t.mask = with_mask ? bits.data() : nullptr;
      t.ema = with_ema ? E.data() : nullptr;
      t.numel = n;
      t.param_dtype = t.grad_dtype = k::DType::kFloat;
      namespace isa = cpu::TORCHSPEED_CPU_ISA_NAMESPACE;
      double psq = 0, usq = 0;
      switch (algo) {
        case k::OptimAlgo::kAdam:
          isa::adam_range<V, float, float>(t, h, s);
          break;
        case k::OptimAlgo::kSgd:
          isa::sgd_range<V, float, float>(t, h, s);
          break;
        case k::OptimAlgo::kLion:
          isa::lion_range<V, float, float>(t, h, s);
          break;
        case k::OptimAlgo::kLamb:
          isa::lamb_phase1_range<V, float, float>(t, h, s, &psq, &usq);
          break;
      }
      k::StepScalars s2 = s;
      if (algo == k::OptimAlgo::kLamb) {
        // Phase 2 with the CPU's norms, so the comparison isolates the element math.
        s2 = k::step_scalars(h, h.lr, scale, clip, true, step, true, psq, usq);
        isa::lamb_phase2_range<V, float, float>(t, h, s2);
      }

      double cpsq = 0, cusq = 0;
      for (int i = 0; i < n; ++i) {
        const float gg = cu::scale_grad(h, s, g[i]);
        switch (algo) {
          case k::OptimAlgo::kAdam:
            cu::adam_element(h, s, gg, p[i], m[i], v[i], vm[i]);
            break;
          case k::OptimAlgo::kSgd:
            cu::sgd_element(h, s, gg, p[i], m[i]);
            break;
          case k::OptimAlgo::kLion:
            cu::lion_element(h, s, gg, p[i], m[i]);
            break;
          case k::OptimAlgo::kLamb: {
            cu::lamb_moments(h, gg, m[i], v[i]);
            const float u = cu::lamb_update(h, s, m[i], v[i], p[i]);
            cpsq += double(p[i]) * p[i];
            cusq += double(u) * u;
            p[i] = cu::lamb_apply(h, s2, m[i], v[i], p[i]);
          } break;
        }
        if (with_mask) p[i] = cu::apply_mask(cu::mask_bit(bits.data(), i), p[i]);
        if (with_ema) ema[i] = cu::ema_update(h, p[i], ema[i]);
        bool ok = same(P[i], p[i]);
        if (t.exp_avg) ok = ok && same(M[i], m[i]);
        if (algo == k::OptimAlgo::kAdam || algo == k::OptimAlgo::kLamb)
          ok = ok && same(Vv[i], v[i]);
        if (algo == k::OptimAlgo::kAdam && h.amsgrad) ok = ok && same(VM[i], vm[i]);
        if (with_ema) ok = ok && same(E[i], ema[i]);
        if (!ok && mismatches++ < 10) {
          UNSCOPED_INFO("algo " << int(algo) << " flags " << flags << " i " << i << ": cpu p "
                                << P[i] << " cuda p " << p[i]);
        }
      }
      if (algo == k::OptimAlgo::kLamb) {
        // The block sums run in another order on the GPU: equal to rounding, not bit for bit
        // (NaN alike when eps == 0 meets zero moments).
        CHECK(cpsq == Approx(psq).epsilon(1e-5));
        if (!(std::isnan(cusq) && std::isnan(usq))) CHECK(cusq == Approx(usq).epsilon(1e-5));
      }
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("CUDA fake-quant element math equals the CPU kernel bit for bit (y and mask)") {
  namespace isa = cpu::TORCHSPEED_CPU_ISA_NAMESPACE;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int n = 4096;
  std::vector<float> x(n), y(n);
  std::vector<uint8_t> mask(n);
  for (int i = 0; i < n; ++i) x[i] = nd(rng) * 6.f;
  // ties, range edges, extremes, inf and NaN
  const float special[] = {0.5f,     1.5f,      2.5f,  -0.5f,   126.5f,   127.5f,
                           -128.5f,  -127.5f,   1e30f, -1e30f,  0.f,      -0.f,
                           INFINITY, -INFINITY, NAN,   255.49f, -255.51f, 3.4e38f};
  for (size_t i = 0; i < sizeof(special) / sizeof(float); ++i) x[i] = special[i];
  int mismatches = 0;
  struct Q {
    float scale, zp, qmin, qmax;
  };
  for (const Q q : {Q{1.f, 0.f, -128.f, 127.f}, Q{0.037f, -5.f, -128.f, 127.f},
                    Q{0.5f, 128.f, 0.f, 255.f}, Q{3.1f, 0.f, -8.f, 7.f}}) {
    const float inv = 1.0f / q.scale;
    isa::fake_quantize_segment<V>(x.data(), y.data(), mask.data(), n, q.scale, inv, q.zp, q.qmin,
                                  q.qmax);
    for (int i = 0; i < n; ++i) {
      bool in_range = false;
      const float v = cu::fake_quant_element(x[i], q.scale, inv, q.zp, q.qmin, q.qmax, in_range);
      if ((!same(v, y[i]) || in_range != (mask[i] == 1)) && mismatches++ < 10) {
        UNSCOPED_INFO("x " << x[i] << ": cpu " << y[i] << "/" << int(mask[i]) << " cuda " << v
                           << "/" << in_range);
      }
    }
  }
  CHECK(mismatches == 0);
}

// The int8 Linear's element math against the formula of kernels/cuda/api.cuh's contract, written
// out here in plain scalar C++ (the CPU kernels implement the same formula).
TEST_CASE("CUDA int8 Linear element math equals the contract's formula bit for bit") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  // row scale: absmax / 127 in fp32, 1 for an all-zero row, NaN for a row with inf or NaN
  CHECK(cu::row_scale_int8(0.f) == 1.f);
  CHECK(std::isnan(cu::row_scale_int8(cu::absmax_operand(INFINITY))));
  CHECK(std::isnan(cu::row_scale_int8(cu::absmax_operand(NAN))));
  CHECK(cu::absmax_operand(-3.f) == 3.f);
  int mismatches = 0;
  for (int r = 0; r < 200; ++r) {
    std::vector<float> row(67);
    float absmax = 0.f, cuda_absmax = 0.f;
    for (auto& v : row) {
      v = nd(rng) * (r % 7 == 0 ? 1e-20f : 3.f);
      absmax = std::max(absmax, std::fabs(v));
      cuda_absmax = k::max_gt(cu::absmax_operand(v), cuda_absmax);
    }
    CHECK(same(absmax, cuda_absmax));
    const float scale = absmax / 127.f;  // the contract
    CHECK(same(cu::row_scale_int8(cuda_absmax), scale));
    const float inv = 1.f / scale;
    for (float v : row) {
      const float want = std::min(std::max(std::nearbyint(v * inv), -127.f), 127.f);
      if (cu::quantize_row_element(v, inv) != static_cast<int8_t>(want) && mismatches++ < 10) {
        UNSCOPED_INFO("quantize " << v << " * " << inv);
      }
    }
  }
  // ties to even, saturation at +-127 (never -128)
  CHECK(cu::quantize_row_element(2.5f, 1.f) == 2);
  CHECK(cu::quantize_row_element(-3.5f, 1.f) == -4);
  CHECK(cu::quantize_row_element(-200.f, 1.f) == -127);
  CHECK(cu::quantize_row_element(127.5f, 1.f) == 127);
  // epilogue: act(float(acc) * (a_scale * w_scale) + bias), no fma, ReLU keeps NaN
  std::uniform_int_distribution<int32_t> acc_dist(-2000000000, 2000000000);
  for (int i = 0; i < 20000; ++i) {
    const int32_t acc = i < 10 ? (i - 5) : acc_dist(rng);
    const float as = std::fabs(nd(rng)) * 1e-2f, ws = std::fabs(nd(rng)) * 1e-3f, b = nd(rng);
    const bool has_bias = i % 3 != 0, relu = i % 2 == 0;
    float want = static_cast<float>(acc) * (as * ws);
    if (has_bias) want = want + b;
    if (relu && want < 0.f) want = 0.f;
    if (!same(cu::int8_linear_epilogue(acc, as, ws, b, has_bias, relu), want) &&
        mismatches++ < 10) {
      UNSCOPED_INFO("epilogue acc " << acc);
    }
  }
  CHECK(std::isnan(cu::int8_linear_epilogue(1, NAN, 1.f, 0.f, false, true)));
  CHECK(mismatches == 0);
}

TEST_CASE("the prune CUDA kernels' per-byte math equals the CPU prune kernels") {
  namespace isa = cpu::TORCHSPEED_CPU_ISA_NAMESPACE;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (auto [n, m] : {std::pair{2, 4}, {1, 4}, {4, 8}, {3, 7}, {0, 5}, {6, 6}, {9, 32}}) {
    const int64_t numel = int64_t{m} * 45;
    std::vector<float> w(numel);
    for (auto& x : w) x = nd(rng);
    for (int64_t i = 0; i < numel; i += 3) w[i] = (i % 2) ? -0.5f : 0.5f;  // ties, both signs
    std::vector<uint16_t> h(numel);  // a 16-bit float's bits: the top half of the fp32
    for (int64_t i = 0; i < numel; ++i) {
      uint32_t u;
      std::memcpy(&u, &w[i], 4);
      h[i] = static_cast<uint16_t>(u >> 16);
    }
    const int64_t bytes = (numel + 7) / 8;
    std::vector<uint8_t> cpu32(bytes), cpu16(bytes);
    isa::nm_mask<V>(w.data(), 4, numel / m, n, m, cpu32.data());
    isa::nm_mask<V>(h.data(), 2, numel / m, n, m, cpu16.data());
    const auto* w32 = reinterpret_cast<const uint32_t*>(w.data());
    for (int64_t b = 0; b < bytes; ++b) {
      INFO(n << ":" << m << " byte " << b);
      REQUIRE(cu::prune_nm_byte(w32, numel, n, m, b) == cpu32[b]);
      REQUIRE(cu::prune_nm_byte(h.data(), numel, n, m, b) == cpu16[b]);
    }
    // pack and apply against the CPU kernels on the same mask.
    std::vector<uint8_t> bools(numel);
    for (int64_t i = 0; i < numel; ++i) bools[i] = (cpu32[i / 8] >> (i % 8)) & 1;
    std::vector<uint8_t> packed(bytes);
    isa::pack_mask<V>(bools.data(), packed.data(), numel);
    auto a = h, c = h;
    isa::apply_mask<V>(a.data(), 2, packed.data(), numel);
    for (int64_t b = 0; b < bytes; ++b) {
      REQUIRE(cu::prune_pack_byte(bools.data(), numel, b) == packed[b]);
      cu::prune_apply_byte(c.data(), packed.data(), numel, b);
    }
    REQUIRE(a == c);
  }
}

TEST_CASE("CUDA int8 optimizer-state codes equal the CPU kernels bit for bit, both ways") {
  namespace isa = cpu::TORCHSPEED_CPU_ISA_NAMESPACE;
  constexpr int64_t kBlock = 64;
  // Decode: every code of both maps, two absmax values (one with a mantissa to round).
  for (const float absmax : {1.f, 0.0137f}) {
    std::vector<int8_t> m_codes(256);
    std::vector<uint8_t> v_codes(256);
    for (int c = 0; c < 256; ++c) {
      m_codes[c] = static_cast<int8_t>(c == 0 ? 0 : c - 128);  // -127 .. 127, and 0 twice
      v_codes[c] = static_cast<uint8_t>(c);
    }
    std::vector<float> absmaxes(256 / kBlock, absmax), m_out(256), v_out(256);
    isa::lowbit_decode<V>(m_codes.data(), true, absmaxes.data(), 256, kBlock, m_out.data());
    isa::lowbit_decode<V>(v_codes.data(), false, absmaxes.data(), 256, kBlock, v_out.data());
    for (int c = 0; c < 256; ++c) {
      CHECK(same(m_out[c], k::lowbit_decode_m(m_codes[c], absmax)));
      CHECK(same(v_out[c], k::lowbit_decode_v(v_codes[c], absmax)));
    }
    // The top codes are exactly the absmax.
    CHECK(k::lowbit_decode_m(127, absmax) == absmax);
    CHECK(k::lowbit_decode_v(255, absmax) == absmax);
  }
  // Encode: values spread over 40 binades, some NaN / inf / negative / zero, blocks with a short
  // last one; the CPU kernel's absmax and codes against the element functions.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-40.f, 0.f);
  const int64_t n = 5 * kBlock + 9;
  std::vector<float> x(n);
  for (auto& e : x) e = normal(rng) * std::exp2(exponent(rng));
  x[3] = 0.f;
  x[70] = std::nanf("");
  x[140] = -0.f;
  for (const bool is_signed : {true, false}) {
    std::vector<float> values = x;
    if (!is_signed) {
      for (auto& e : values) e = e * e;
      values[200] = -1.f;  // negative second moment: code 0
    }
    std::vector<int8_t> codes(n);
    std::vector<float> absmax((n + kBlock - 1) / kBlock);
    isa::lowbit_encode<V>(values.data(), n, kBlock, is_signed, codes.data(), absmax.data());
    for (int64_t b = 0; b * kBlock < n; ++b) {
      float amax = 0.f;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
        const float t = is_signed ? std::fabs(values[i]) : values[i];
        amax = t > amax ? t : amax;
      }
      CHECK(same(absmax[b], amax));
      const float inv = k::lowbit_inverse(amax);
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
        if (is_signed) {
          CHECK(codes[i] == k::lowbit_encode_m(values[i], inv));
        } else {
          CHECK(static_cast<uint8_t>(codes[i]) == k::lowbit_encode_v(values[i], inv));
        }
      }
    }
  }
}

// ---- adam_lowbit_step_: the CUDA element / block math against the CPU kernels -----------------

namespace {

/// The CPU kernel tables this machine runs (scalar up to the best ISA; avx512_vnni and amx share
/// the avx512 unit's optimizer kernels).
std::vector<const cpu::CpuKernelTable*> runnable_tables() {
  std::vector<const cpu::CpuKernelTable*> out;
  for (cpu::Isa isa : cpu::compiled_isas()) {
    if (isa == cpu::Isa::kAvx512Vnni || isa == cpu::Isa::kAmx) continue;
    if (const cpu::CpuKernelTable* t = cpu::cpu_kernels_for(isa)) out.push_back(t);
  }
  return out;
}

/// One low-bit step's inputs and outputs (float32 params and grads, optional master / mask / EMA).
struct LowbitCase {
  std::vector<float> param, grad, master, ema;
  std::vector<uint8_t> mask_bits;
  std::vector<uint16_t> m16, v16;  // bf16 moments
  std::vector<int8_t> m8;          // int8 moments
  std::vector<uint8_t> v8;
  std::vector<float> m_absmax, v_absmax;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // An empty vector's data() may be null, which memcmp must not get (even for 0 bytes).
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// flags: bit 0 weight decay, 1 decoupled, 2 maximize, 3 mask, 4 EMA, 5 master, 6 AMP scale and
/// clip, 7 eps 0.
k::OptimHyper lowbit_hyper(int flags, k::StateFormat format, int32_t block) {
  k::OptimHyper h{};
  h.lr = 3e-3;
  h.beta1 = 0.9;
  h.beta2 = (flags & 64) ? 0.95 : 0.999;
  h.weight_decay = (flags & 1) ? 0.1f : 0.f;
  h.beta2_f = float(h.beta2);
  h.one_minus_beta1 = float(1.0 - h.beta1);
  h.one_minus_beta2 = float(1.0 - h.beta2);
  h.eps = (flags & 128) ? 0.f : 1e-8f;
  h.one_minus_ema_decay = float(1.0 - 0.99);
  h.maximize = flags & 4;
  h.decoupled_weight_decay = flags & 2;
  h.state_format = format;
  h.state_block = block;
  return h;
}

LowbitCase make_lowbit_case(int64_t n, int flags, k::StateFormat format, int32_t block,
                            uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> exponent(-30.f, 0.f);
  LowbitCase c;
  const float scale = (flags & 64) ? 512.f : 1.f;
  c.param.resize(n);
  c.grad.resize(n);
  std::vector<float> m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    c.param[i] = nd(rng);
    c.grad[i] = nd(rng) * std::exp2(exponent(rng) * 0.3f) * scale;
    m[i] = nd(rng) * std::exp2(exponent(rng)) * 0.1f;
    v[i] = m[i] * m[i] * 3.f + std::fabs(nd(rng)) * 1e-6f;
    if (i % 89 == 0) c.grad[i] = 0.f;
    if (i % 97 == 0) m[i] = v[i] = 0.f;
  }
  if (format == k::StateFormat::kInt8 && n > 3 * block) {
    // a block of zeros (grads and moments: absmax 0, codes 0), one with an inf grad (absmax inf,
    // codes 0) and one with a NaN grad (NaN skipped by the absmax, its code +-127)
    for (int64_t i = block; i < 2 * block; ++i) c.grad[i] = m[i] = v[i] = 0.f;
    c.grad[2 * block + 3] = INFINITY;
    c.grad[3 * block - 1] = NAN;
  } else if (n > 40) {
    c.grad[17] = INFINITY;
    c.grad[29] = NAN;
  }
  if (format == k::StateFormat::kBFloat16) {
    c.m16.resize(n);
    c.v16.resize(n);
    for (int64_t i = 0; i < n; ++i) {  // truncated to bf16: exact moments to start from
      c.m16[i] = static_cast<uint16_t>(k::lowbit_bits(m[i]) >> 16);
      c.v16[i] = static_cast<uint16_t>(k::lowbit_bits(v[i]) >> 16);
    }
  } else {
    const int64_t blocks = (n + block - 1) / block;
    c.m8.resize(n);
    c.v8.resize(n);
    c.m_absmax.resize(blocks);
    c.v_absmax.resize(blocks);
    for (int64_t b = 0; b < blocks; ++b) {
      float ma = 0.f, va = 0.f;
      for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
        ma = k::lowbit_absmax_m(ma, m[i]);
        va = k::lowbit_absmax_v(va, v[i]);
      }
      c.m_absmax[b] = ma;
      c.v_absmax[b] = va;
      for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
        c.m8[i] = k::lowbit_encode_m(m[i], k::lowbit_inverse(ma));
        c.v8[i] = k::lowbit_encode_v(v[i], k::lowbit_inverse(va));
      }
    }
  }
  if (flags & 8) {
    c.mask_bits.resize((n + 7) / 8);
    for (auto& b : c.mask_bits) b = static_cast<uint8_t>(rng());
  }
  if (flags & 16) {
    c.ema.resize(n);
    for (auto& e : c.ema) e = nd(rng);
  }
  if (flags & 32) {
    c.master = c.param;
    for (auto& p : c.param) p = std::nanf("");  // the step must read the master, not the param
  }
  return c;
}

k::OptimTensor lowbit_tensor(LowbitCase& c, int64_t sr_index, uint32_t salt) {
  k::OptimTensor t{};
  t.param = c.param.data();
  t.grad = c.grad.data();
  t.master = c.master.empty() ? nullptr : c.master.data();
  t.mask = c.mask_bits.empty() ? nullptr : c.mask_bits.data();
  t.ema = c.ema.empty() ? nullptr : c.ema.data();
  if (!c.m16.empty()) {
    t.exp_avg_lp = c.m16.data();
    t.exp_avg_sq_lp = c.v16.data();
  } else {
    t.exp_avg_lp = c.m8.data();
    t.exp_avg_sq_lp = c.v8.data();
    t.exp_avg_absmax = c.m_absmax.data();
    t.exp_avg_sq_absmax = c.v_absmax.data();
  }
  t.sr_index = sr_index;
  t.sr_salt = salt;
  t.numel = static_cast<int64_t>(c.param.size());
  t.param_dtype = t.grad_dtype = k::DType::kFloat;
  return t;
}

/// store_param as optim_lowbit.cu's store_param_quad does it, for element i.
void cuda_store_param(LowbitCase& c, const k::OptimHyper& h, int64_t i, float p) {
  if (!c.mask_bits.empty()) p = cu::apply_mask(cu::mask_bit(c.mask_bits.data(), i), p);
  if (!c.master.empty()) c.master[i] = p;
  c.param[i] = p;
  if (!c.ema.empty()) c.ema[i] = cu::ema_update(h, p, c.ema[i]);
}

float cuda_load_param(const LowbitCase& c, int64_t i) {
  return c.master.empty() ? c.param[i] : c.master[i];
}

/// adam_bf16_kernel's per-element work, element by element, for elements sr_index + [0, n).
void cuda_bf16_step(LowbitCase& c, const k::OptimHyper& h, const k::StepScalars& s,
                    int64_t sr_index, uint32_t salt) {
  const float inv_bc2 = cu::adam_lowbit_inv_bc2(s);
  for (int64_t i = 0; i < static_cast<int64_t>(c.param.size()); ++i) {
    float p = cuda_load_param(c, i);
    cu::adam_bf16_element(h, s, inv_bc2, k::lowbit_sr_noise(sr_index + i, salt),
                          cu::scale_grad(h, s, c.grad[i]), p, k::lowbit_bf16_value(c.m16[i]),
                          k::lowbit_bf16_value(c.v16[i]), c.m16[i], c.v16[i]);
    cuda_store_param(c, h, i, p);
  }
}

/// adam_int8_kernel's work, one quantization block after the other: the three phases of
/// optim_lowbit_math.cuh (the GPU's reduction order over a block does not change a max).
void cuda_int8_step(LowbitCase& c, const k::OptimHyper& h, const k::StepScalars& s) {
  const float inv_bc2 = cu::adam_lowbit_inv_bc2(s);
  const int64_t n = static_cast<int64_t>(c.param.size()), block = h.state_block;
  std::vector<float> p(block), m(block), v(block);
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = std::min(block, n - b0), kb = b0 / block;
    float m_acc = 0.f, v_acc = 0.f;
    for (int64_t j = 0; j < len; ++j) {
      p[j] = cuda_load_param(c, b0 + j);
      cu::adam_int8_moments(h, cu::scale_grad(h, s, c.grad[b0 + j]), p[j], c.m8[b0 + j],
                            c.v8[b0 + j], c.m_absmax[kb], c.v_absmax[kb], m[j], v[j], m_acc, v_acc);
    }
    c.m_absmax[kb] = m_acc;
    c.v_absmax[kb] = v_acc;
    const float m_inv = k::lowbit_inverse(m_acc), v_inv = k::lowbit_inverse(v_acc);
    for (int64_t j = 0; j < len; ++j) {
      cu::adam_int8_finish(h, s, inv_bc2, m_inv, v_inv, m[j], v[j], p[j], c.m8[b0 + j],
                           c.v8[b0 + j]);
      cuda_store_param(c, h, b0 + j, p[j]);
    }
  }
}

std::string lowbit_mismatch(const LowbitCase& a, const LowbitCase& b) {
  std::string out;
  if (!same_bits(a.param, b.param)) out += " param";
  if (!same_bits(a.master, b.master)) out += " master";
  if (!same_bits(a.ema, b.ema)) out += " ema";
  if (a.m16 != b.m16) out += " bf16 exp_avg";
  if (a.v16 != b.v16) out += " bf16 exp_avg_sq";
  if (a.m8 != b.m8) out += " int8 exp_avg";
  if (a.v8 != b.v8) out += " uint8 exp_avg_sq";
  if (!same_bits(a.m_absmax, b.m_absmax)) out += " exp_avg_absmax";
  if (!same_bits(a.v_absmax, b.v_absmax)) out += " exp_avg_sq_absmax";
  return out;
}

}  // namespace

TEST_CASE("the bf16 stochastic-rounding hash equals the CPU's vector hash, lane by lane") {
  namespace isa = cpu::TORCHSPEED_CPU_ISA_NAMESPACE;
  using I = V::I32;
  std::mt19937 rng(5);
  for (int r = 0; r < 100000; ++r) {
    const int64_t first =
        (static_cast<int64_t>(rng() % 64) << 32) | (static_cast<int64_t>(rng() % 4096) << 16);
    const uint32_t salt = rng(), offset = rng() % 65536;
    const uint32_t range_salt = isa::sr_range_salt(salt, first);
    const I cpu_noise = isa::sr_noise<V>(static_cast<uint32_t>(first) + offset, range_salt);
    const uint32_t cuda_noise = k::lowbit_sr_noise(first + offset, salt);
    REQUIRE(static_cast<uint32_t>(cpu_noise.v) == cuda_noise);
    // Rounding of any float32 (NaN, inf and values near the top included) with that noise.
    uint32_t bits = rng();
    if (r % 7 == 0) bits = (bits & 0x807FFFFFu) | 0x7F800000u;   // inf / NaN
    if (r % 11 == 0) bits = (bits & 0x8000FFFFu) | 0x7F7F0000u;  // the largest binade
    const float x = k::lowbit_float(bits);
    uint16_t cpu_bits = 0;
    isa::store_bf16_stochastic(V(x), cpu_noise & I::from_u32(0xFFFFu),
                               reinterpret_cast<cpu::bf16*>(&cpu_bits));
    REQUIRE(cpu_bits == k::lowbit_bf16_stochastic(x, cuda_noise & 0xFFFFu));
  }
  // The salt of a step: the formula the CPU op uses.
  CHECK(k::lowbit_step_salt(3.f, 2) == 3u * 0x9E3779B9u + 2u * 0x7FEB352Du);
}

TEST_CASE("CUDA adam_lowbit_step_ math equals the CPU kernels bit for bit (bf16, every ISA)") {
  const auto tables = runnable_tables();
  REQUIRE(!tables.empty());
  int mismatches = 0;
  for (int flags = 0; flags < 256; ++flags) {
    const k::OptimHyper h = lowbit_hyper(flags, k::StateFormat::kBFloat16, 256);
    const float scale = (flags & 64) ? 512.f : 1.f, clip = (flags & 64) ? 0.7f : 1.f;
    const float step = float(flags % 9 + 1);
    const k::StepScalars s = k::step_scalars(h, h.lr, scale, clip, true, step);
    const uint32_t salt = k::lowbit_step_salt(step, flags % 5);
    // A range as the CPU op cuts them (starting on a multiple of 2^16), past 2^32 for some.
    const int64_t sr_index = (flags % 3 == 0) ? (int64_t{1} << 32) + (3 << 16) : (flags % 3) << 16;
    const LowbitCase start =
        make_lowbit_case(1000 + flags % 37, flags, k::StateFormat::kBFloat16, 256, flags);
    LowbitCase want = start;
    cuda_bf16_step(want, h, s, sr_index, salt);
    for (const cpu::CpuKernelTable* table : tables) {
      LowbitCase got = start;
      table->optim.adam(lowbit_tensor(got, sr_index, salt), h, s, nullptr, nullptr);
      const std::string diff = lowbit_mismatch(got, want);
      if (!diff.empty() && mismatches++ < 10) {
        UNSCOPED_INFO("bf16 flags " << flags << " isa " << cpu::isa_name(table->isa) << ":"
                                    << diff);
      }
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("CUDA adam_lowbit_step_ math equals the CPU kernels bit for bit (int8, every ISA)") {
  const auto tables = runnable_tables();
  REQUIRE(!tables.empty());
  int mismatches = 0;
  for (const int32_t block : {8, 64, 256, 4096}) {
    for (int flags = 0; flags < 256; flags += (block == 4096 ? 5 : 1)) {
      const k::OptimHyper h = lowbit_hyper(flags, k::StateFormat::kInt8, block);
      const float scale = (flags & 64) ? 512.f : 1.f, clip = (flags & 64) ? 0.7f : 1.f;
      const float step = float(flags % 9 + 1);
      const k::StepScalars s = k::step_scalars(h, h.lr, scale, clip, true, step);
      const int64_t n = 4 * block + 1 + flags % 7;  // a short last block
      const LowbitCase start = make_lowbit_case(n, flags, k::StateFormat::kInt8, block, flags);
      LowbitCase want = start;
      cuda_int8_step(want, h, s);
      for (const cpu::CpuKernelTable* table : tables) {
        LowbitCase got = start;
        table->optim.adam(lowbit_tensor(got, 0, 0), h, s, nullptr, nullptr);
        const std::string diff = lowbit_mismatch(got, want);
        if (!diff.empty() && mismatches++ < 10) {
          UNSCOPED_INFO("int8 block " << block << " flags " << flags << " isa "
                                      << cpu::isa_name(table->isa) << ":" << diff);
        }
      }
    }
  }
  CHECK(mismatches == 0);
}

// ---- lion_lowbit_step_ / sgd_lowbit_step_: one signed moment, against the CPU kernels ----------

TEST_CASE("the stochastic int8 code of a moment equals the CPU's vector code, lane by lane") {
  namespace isa = cpu::TORCHSPEED_CPU_ISA_NAMESPACE;
  using I = V::I32;
  std::mt19937 rng(11);
  int ups = 0;  // codes above the nearest one: the noise is really used
  for (int r = 0; r < 200000; ++r) {
    uint32_t bits = rng();
    if (r % 7 == 0) bits = (bits & 0x807FFFFFu) | 0x7F800000u;  // inf / NaN
    if (r % 5 == 0) bits = (bits & 0x80FFFFFFu) | 0x3E000000u;  // within a few binades of absmax
    const float m = k::lowbit_float(bits);
    float absmax = std::fabs(m) * std::exp2(float(rng() % 24)) * (1.f + float(rng() % 1000) / 1e3f);
    if (r % 13 == 0) absmax = 0.f;       // an all-zero block: inverse 0
    if (r % 17 == 0) absmax = INFINITY;  // a block holding inf: inverse 0, inf * 0 is NaN
    const float inv = k::lowbit_inverse(absmax);
    const uint32_t noise = rng() & 0xFFFFFu;
    int8_t cpu_code = 0;
    isa::quant_m_stochastic(V(m), inv, I::from_u32(noise), &cpu_code);
    const int8_t cuda_code = k::lowbit_encode_m_stochastic(m, inv, noise);
    REQUIRE(cpu_code == cuda_code);
    if (cuda_code != k::lowbit_encode_m(m, inv)) ++ups;
  }
  CHECK(ups > 1000);
  // Codes that are exact stay put whatever the noise: the absmax element is 127.
  CHECK(k::lowbit_encode_m_stochastic(-3.5f, k::lowbit_inverse(3.5f), 0xFFFFFu) == -127);
  CHECK(k::lowbit_encode_m_stochastic(0.f, 1.f, 0xFFFFFu) == 0);
}

namespace {

/// Lion's or SGD's hyperparameters for lowbit_hyper's flags (Lion: beta2 0.99; SGD: momentum 0.9,
/// flags % 3 == 0 the first step, bit 1 dampening 0.1, bit 7 Nesterov).
k::OptimHyper one_moment_hyper(k::OptimAlgo algo, int flags, k::StateFormat format, int32_t block) {
  k::OptimHyper h = lowbit_hyper(flags, format, block);
  h.eps = 0.f;
  if (algo == k::OptimAlgo::kLion) {
    h.lr = 1e-2;
    h.beta2 = 0.99;
    h.beta2_f = float(h.beta2);
    h.one_minus_beta2 = float(1.0 - h.beta2);
  } else {
    h.momentum = 0.9f;
    h.one_minus_dampening = float(1.0 - ((flags & 2) ? 0.1 : 0.0));
    h.nesterov = flags & 128;
    h.first_step = flags % 3 == 0;
  }
  return h;
}

/// make_lowbit_case with one moment (exp_avg) only.
LowbitCase make_one_moment_case(int64_t n, int flags, k::StateFormat format, int32_t block,
                                uint32_t seed) {
  LowbitCase c = make_lowbit_case(n, flags, format, block, seed);
  c.v16.clear();
  c.v8.clear();
  c.v_absmax.clear();
  return c;
}

/// bf16_kernel<kAlgo>'s per-element work, element by element, for elements sr_index + [0, n).
template <k::OptimAlgo kAlgo>
void cuda_signed_bf16_step(LowbitCase& c, const k::OptimHyper& h, const k::StepScalars& s,
                           int64_t sr_index, uint32_t salt) {
  for (int64_t i = 0; i < static_cast<int64_t>(c.param.size()); ++i) {
    float p = cuda_load_param(c, i);
    cu::signed_moment_bf16_element<kAlgo>(h, s, k::lowbit_sr_noise(sr_index + i, salt),
                                          cu::scale_grad(h, s, c.grad[i]), p,
                                          k::lowbit_bf16_value(c.m16[i]), c.m16[i]);
    cuda_store_param(c, h, i, p);
  }
}

/// signed_moment_int8_kernel<kAlgo>'s work, one quantization block after the other: the two
/// phases of optim_lowbit_math.cuh. Returns how many codes differ from rounding to nearest.
template <k::OptimAlgo kAlgo>
int cuda_signed_int8_step(LowbitCase& c, const k::OptimHyper& h, const k::StepScalars& s,
                          int64_t sr_index, uint32_t salt) {
  const int64_t n = static_cast<int64_t>(c.param.size()), block = h.state_block;
  std::vector<float> m(block);
  int not_nearest = 0;
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = std::min(block, n - b0), kb = b0 / block;
    float acc = 0.f;
    for (int64_t j = 0; j < len; ++j) {
      float p = cuda_load_param(c, b0 + j);
      cu::signed_moment_int8_update<kAlgo>(h, s, cu::scale_grad(h, s, c.grad[b0 + j]), p,
                                           c.m8[b0 + j], c.m_absmax[kb], m[j], acc);
      cuda_store_param(c, h, b0 + j, p);
    }
    c.m_absmax[kb] = acc;
    const float inv = k::lowbit_inverse(acc);
    for (int64_t j = 0; j < len; ++j) {
      c.m8[b0 + j] =
          cu::signed_moment_int8_code(m[j], inv, k::lowbit_sr_noise(sr_index + b0 + j, salt));
      not_nearest += c.m8[b0 + j] != k::lowbit_encode_m(m[j], inv);
    }
  }
  return not_nearest;
}

/// Runs the one-moment comparison for `algo` and `format` over the flag combinations and blocks;
/// returns the number of mismatching (case, ISA) pairs.
template <k::OptimAlgo kAlgo>
int one_moment_mismatches(k::StateFormat format) {
  const auto tables = runnable_tables();
  REQUIRE(!tables.empty());
  const bool int8 = format == k::StateFormat::kInt8;
  int mismatches = 0, stochastic_ups = 0;
  for (const int32_t block :
       int8 ? std::vector<int32_t>{8, 64, 256, 4096} : std::vector<int32_t>{256}) {
    for (int flags = 0; flags < 256; flags += (block == 4096 ? 5 : 1)) {
      const k::OptimHyper h = one_moment_hyper(kAlgo, flags, format, block);
      const float scale = (flags & 64) ? 512.f : 1.f, clip = (flags & 64) ? 0.7f : 1.f;
      const float step = float(flags % 9 + 1);
      const k::StepScalars s = k::step_scalars(h, h.lr, scale, clip, true, step);
      const uint32_t salt = k::lowbit_step_salt(step, flags % 5);
      // A range as the CPU op cuts them (on a multiple of 2^16), past 2^32 for some.
      const int64_t sr_index =
          (flags % 3 == 0) ? (int64_t{1} << 32) + (3 << 16) : int64_t{flags % 3} << 16;
      const int64_t n = int8 ? 4 * block + 1 + flags % 7 : 1000 + flags % 37;
      const LowbitCase start = make_one_moment_case(n, flags, format, block, flags);
      LowbitCase want = start;
      if (int8) {
        stochastic_ups += cuda_signed_int8_step<kAlgo>(want, h, s, sr_index, salt);
      } else {
        cuda_signed_bf16_step<kAlgo>(want, h, s, sr_index, salt);
      }
      for (const cpu::CpuKernelTable* table : tables) {
        LowbitCase got = start;
        const cpu::OptimFn fn = kAlgo == k::OptimAlgo::kLion ? table->optim.lion : table->optim.sgd;
        fn(lowbit_tensor(got, sr_index, salt), h, s, nullptr, nullptr);
        const std::string diff = lowbit_mismatch(got, want);
        if (!diff.empty() && mismatches++ < 10) {
          UNSCOPED_INFO((kAlgo == k::OptimAlgo::kLion ? "lion" : "sgd")
                        << (int8 ? " int8 block " : " bf16 block ") << block << " flags " << flags
                        << " isa " << cpu::isa_name(table->isa) << ":" << diff);
        }
      }
    }
  }
  // int8: the codes are really rounded stochastically (many differ from the nearest ones).
  if (int8) CHECK(stochastic_ups > 1000);
  return mismatches;
}

}  // namespace

TEST_CASE(
    "CUDA lion_lowbit_step_ math equals the CPU kernels bit for bit (bf16, int8, every ISA)") {
  CHECK(one_moment_mismatches<k::OptimAlgo::kLion>(k::StateFormat::kBFloat16) == 0);
  CHECK(one_moment_mismatches<k::OptimAlgo::kLion>(k::StateFormat::kInt8) == 0);
}

TEST_CASE("CUDA sgd_lowbit_step_ math equals the CPU kernels bit for bit (bf16, int8, every ISA)") {
  CHECK(one_moment_mismatches<k::OptimAlgo::kSgd>(k::StateFormat::kBFloat16) == 0);
  CHECK(one_moment_mismatches<k::OptimAlgo::kSgd>(k::StateFormat::kInt8) == 0);
}
