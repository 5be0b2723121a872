// Torch-free tests of the CPU kernel layer: every ISA this CPU can run, against double-precision
// references computed here, at lengths that exercise the vector body, the 4x unroll and the tail.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "catch_shim.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/vec.h"

using namespace torchspeed::kernels::cpu;
using isa_test::to_bf16;
using isa_test::to_float;
using isa_test::to_fp16;
using torchspeed::kernels::StateFormat;

namespace {

std::vector<const CpuKernelTable*> runnable_tables() {
  std::vector<const CpuKernelTable*> out;
  for (Isa isa : compiled_isas()) {
    // avx512_vnni and amx share the avx512 unit's kernels except the int8 Linear's (tested in
    // tests/cpp/quant and test_int8_linear.py).
    if (isa == Isa::kAvx512Vnni || isa == Isa::kAmx) continue;
    if (const CpuKernelTable* t = cpu_kernels_for(isa)) out.push_back(t);
  }
  return out;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

}  // namespace

TEST_CASE("bf16 and fp16 conversions round to nearest even and keep inf/NaN") {
  CHECK(to_bf16(1.0f).bits == 0x3f80);
  CHECK(to_bf16(-2.0f).bits == 0xc000);
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
  CHECK(to_bf16(1.00390625f).bits == 0x3f80);
  CHECK(to_bf16(1.01171875f).bits == 0x3f82);  // 1 + 3*2^-8: tie rounds up to even
  CHECK(std::isnan(to_float(to_bf16(NAN))));
  CHECK(std::isinf(to_float(to_bf16(INFINITY))));
  CHECK(to_fp16(1.0f).bits == 0x3c00);
  CHECK(to_fp16(65504.f).bits == 0x7bff);
  CHECK(to_fp16(65520.f).bits == 0x7c00);         // rounds to inf
  CHECK(to_fp16(5.9604645e-08f).bits == 0x0001);  // smallest subnormal
  CHECK(to_float(fp16{0x0001}) == Approx(5.9604645e-08f));
  CHECK(to_float(fp16{0x8400}) == -6.103515625e-05f);
  CHECK(std::isnan(to_float(to_fp16(NAN))));
  // Every half value survives half -> float -> half.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const fp16 h{static_cast<uint16_t>(b)};
    const float f = to_float(h);
    if (std::isnan(f)) continue;
    REQUIRE(to_fp16(f).bits == h.bits);
  }
}

TEST_CASE("grad_stats matches a double reference on every ISA and dtype") {
  const auto tables = runnable_tables();
  REQUIRE(!tables.empty());
  for (const CpuKernelTable* table : tables) {
    for (int64_t n : {0, 1, 7, 16, 63, 64, 65, 1000, 4096, 4097, 70001}) {
      const auto src = random_floats(static_cast<size_t>(n), 1234u + static_cast<uint32_t>(n));
      const float inv = 0.125f;
      double ref_read = 0, ref_unscaled = 0;
      for (float x : src) {
        ref_read += double(x) * double(x);
        ref_unscaled += double(x * inv) * double(x * inv);
      }
      INFO("isa " << table->name << " n " << n);
      std::vector<float> f32 = src;
      GradStatsPartial out{};
      table->optim.grad_stats(DType::kFloat, f32.data(), n, nullptr, &out);
      CHECK(out.sumsq == Approx(ref_read).epsilon(1e-6));
      CHECK_FALSE(out.nonfinite);
      table->optim.grad_stats(DType::kFloat, f32.data(), n, &inv, &out);
      CHECK(out.sumsq == Approx(ref_unscaled).epsilon(1e-6));
      for (int64_t i = 0; i < n; ++i) REQUIRE(f32[i] == src[i] * inv);

      std::vector<double> f64(src.begin(), src.end());
      table->optim.grad_stats(DType::kDouble, f64.data(), n, nullptr, &out);
      CHECK(out.sumsq == Approx(ref_read).epsilon(1e-12));

      std::vector<bf16> b16(src.size());
      double ref_b16 = 0;
      for (size_t i = 0; i < src.size(); ++i) {
        b16[i] = to_bf16(src[i]);
        const float u = to_float(b16[i]) * inv;
        ref_b16 += double(u) * double(u);
      }
      table->optim.grad_stats(DType::kBFloat16, b16.data(), n, &inv, &out);
      CHECK(out.sumsq == Approx(ref_b16).epsilon(1e-6));
      for (size_t i = 0; i < src.size(); ++i) {
        REQUIRE(b16[i].bits == to_bf16(to_float(to_bf16(src[i])) * inv).bits);
      }

      std::vector<fp16> h16(src.size());
      for (size_t i = 0; i < src.size(); ++i) h16[i] = to_fp16(src[i]);
      table->optim.grad_stats(DType::kHalf, h16.data(), n, &inv, &out);
      for (size_t i = 0; i < src.size(); ++i) {
        REQUIRE(h16[i].bits == to_fp16(to_float(to_fp16(src[i])) * inv).bits);
      }
    }
  }
}

TEST_CASE("grad_stats flags inf and NaN wherever they are") {
  for (const CpuKernelTable* table : runnable_tables()) {
    for (int64_t pos : {0, 5, 31, 64, 99}) {
      for (float bad : {INFINITY, -INFINITY, NAN}) {
        std::vector<float> v(100, 1.f);
        v[static_cast<size_t>(pos)] = bad;
        GradStatsPartial out{};
        table->optim.grad_stats(DType::kFloat, v.data(), 100, nullptr, &out);
        INFO("isa " << table->name << " pos " << pos << " value " << bad);
        CHECK(out.nonfinite);
      }
    }
  }
}

namespace {

/// An fp32 param range with the given state pointers (null: absent).
OptimTensor f32_tensor(float* p, const float* g, int64_t n, float* exp_avg = nullptr,
                       float* exp_avg_sq = nullptr, const uint8_t* mask = nullptr,
                       float* ema = nullptr) {
  OptimTensor t{};
  t.param = p;
  t.grad = g;
  t.exp_avg = exp_avg;
  t.exp_avg_sq = exp_avg_sq;
  t.mask = mask;
  t.ema = ema;
  t.numel = n;
  t.param_dtype = t.grad_dtype = DType::kFloat;
  return t;
}

std::vector<float> positive_floats(size_t n, uint32_t seed, float scale) {
  auto v = random_floats(n, seed, scale);
  for (auto& x : v) x = std::fabs(x);
  return v;
}

}  // namespace

TEST_CASE("adam kernel matches a double reference of torch's formula on every ISA") {
  for (const CpuKernelTable* table : runnable_tables()) {
    const int64_t n = 1037;
    auto p = random_floats(n, 1), g = random_floats(n, 2), m = random_floats(n, 3, 0.1f);
    auto v = positive_floats(n, 4, 0.01f);
    OptimHyper h{};
    h.weight_decay = 0.01f, h.beta2_f = 0.999f, h.one_minus_beta1 = 0.1f;
    h.one_minus_beta2 = 0.001f, h.eps = 1e-8f, h.decoupled_weight_decay = true;
    const double step = 3, bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.999, step);
    StepScalars s{};
    s.lr = 1e-3f, s.step_size = float(1e-3 / bc1), s.bias_correction2_sqrt = float(std::sqrt(bc2));
    s.param_decay = float(1 - 1e-3 * 0.01), s.grad_scale = 0.5f;
    std::vector<float> p2 = p, m2 = m, v2 = v;
    table->optim.adam(f32_tensor(p2.data(), g.data(), n, m2.data(), v2.data()), h, s, nullptr,
                      nullptr);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = double(g[i]) * 0.5;
      double pi = double(p[i]) * (1 - 1e-3 * 0.01);
      const double mi = 0.9 * m[i] + 0.1 * gi, vi = 0.999 * v[i] + 0.001 * gi * gi;
      pi -= (1e-3 / bc1) * mi / (std::sqrt(vi) / std::sqrt(bc2) + 1e-8);
      INFO("isa " << table->name << " i " << i);
      REQUIRE(m2[i] == Approx(mi).epsilon(1e-5).margin(1e-7));
      REQUIRE(v2[i] == Approx(vi).epsilon(1e-5).margin(1e-9));
      REQUIRE(p2[i] == Approx(pi).epsilon(1e-6).margin(1e-6));
    }
  }
}

TEST_CASE("sgd kernel matches a double reference (momentum, nesterov, mask, EMA) on every ISA") {
  const double lr = 0.05, momentum = 0.9, dampening = 0.1, wd = 0.01, ema_decay = 0.9;
  for (const CpuKernelTable* table : runnable_tables()) {
    for (int mode = 0; mode < 4; ++mode) {
      const bool nesterov = mode & 1, first_step = mode & 2;
      const int64_t n = 517;
      auto p = random_floats(n, 11), g = random_floats(n, 12), buf = random_floats(n, 13);
      auto ema = random_floats(n, 14);
      std::vector<float> mask(n);
      std::vector<uint8_t> bits((n + 7) / 8, 0);  // packed: bit i = element i
      for (int64_t i = 0; i < n; ++i) {
        mask[i] = (i % 3) ? 1.f : 0.f;
        if (mask[i] != 0.f) bits[i / 8] |= uint8_t(1u << (i % 8));
      }
      OptimHyper h{};
      h.weight_decay = float(wd), h.momentum = float(momentum);
      h.one_minus_dampening = float(1 - dampening), h.nesterov = nesterov;
      h.first_step = first_step, h.one_minus_ema_decay = float(1 - ema_decay);
      StepScalars s{};
      s.lr = float(lr), s.grad_scale = 1.f;
      auto p2 = p, buf2 = buf, ema2 = ema;
      table->optim.sgd(
          f32_tensor(p2.data(), g.data(), n, buf2.data(), nullptr, bits.data(), ema2.data()), h, s,
          nullptr, nullptr);
      for (int64_t i = 0; i < n; ++i) {
        double gi = g[i] + wd * p[i];
        const double bi = first_step ? gi : momentum * buf[i] + (1 - dampening) * gi;
        gi = nesterov ? gi + momentum * bi : bi;
        const double pi = mask[i] != 0.f ? p[i] - lr * gi : 0.0;
        const double ei = ema[i] + (1 - ema_decay) * (pi - ema[i]);
        INFO("isa " << table->name << " nesterov " << nesterov << " first " << first_step << " i "
                    << i);
        REQUIRE(buf2[i] == Approx(bi).epsilon(1e-5).margin(1e-6));
        REQUIRE(p2[i] == Approx(pi).epsilon(1e-5).margin(1e-6));
        REQUIRE(ema2[i] == Approx(ei).epsilon(1e-5).margin(1e-6));
      }
    }
  }
}

TEST_CASE("lion kernel matches a double reference on every ISA") {
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.99, wd = 0.1;
  for (const CpuKernelTable* table : runnable_tables()) {
    const int64_t n = 771;
    auto p = random_floats(n, 21), g = random_floats(n, 22), m = random_floats(n, 23);
    OptimHyper h{};
    h.weight_decay = float(wd), h.one_minus_beta1 = float(1 - beta1);
    h.one_minus_beta2 = float(1 - beta2), h.beta2_f = float(beta2);
    StepScalars s{};
    s.lr = float(lr), s.grad_scale = 1.f, s.param_decay = float(1 - lr * wd);
    auto p2 = p, m2 = m;
    table->optim.lion(f32_tensor(p2.data(), g.data(), n, m2.data()), h, s, nullptr, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      const double c = beta1 * m[i] + (1 - beta1) * g[i];
      if (std::fabs(c) < 1e-5) continue;  // the sign of a value this close to 0 is rounding
      const double pi = p[i] * (1 - lr * wd) - lr * (c > 0 ? 1.0 : -1.0);
      const double mi = beta2 * m[i] + (1 - beta2) * g[i];
      INFO("isa " << table->name << " i " << i);
      REQUIRE(p2[i] == Approx(pi).epsilon(1e-6).margin(1e-7));
      REQUIRE(m2[i] == Approx(mi).epsilon(1e-5).margin(1e-6));
    }
  }
}

TEST_CASE("lamb kernels (moments, norms, trust-ratio update) match a double reference") {
  const double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, eps = 1e-6, wd = 0.01, step = 5;
  const double bc1 = 1 - std::pow(beta1, step), bc2 = 1 - std::pow(beta2, step);
  for (const CpuKernelTable* table : runnable_tables()) {
    const int64_t n = 1029;
    auto p = random_floats(n, 31), g = random_floats(n, 32), m = random_floats(n, 33, 0.1f);
    auto v = positive_floats(n, 34, 0.01f);
    OptimHyper h{};
    h.weight_decay = float(wd), h.one_minus_beta1 = float(1 - beta1);
    h.one_minus_beta2 = float(1 - beta2), h.beta2_f = float(beta2), h.eps = float(eps);
    StepScalars s{};
    s.lr = float(lr), s.grad_scale = 1.f, s.bias_correction1 = float(bc1);
    s.bias_correction2 = float(bc2);
    auto p2 = p, m2 = m, v2 = v;
    const OptimTensor t = f32_tensor(p2.data(), g.data(), n, m2.data(), v2.data());
    double p_sumsq = 0, u_sumsq = 0;
    table->optim.lamb_phase1(t, h, s, &p_sumsq, &u_sumsq);

    std::vector<double> u(n), mi(n), vi(n);
    double p_ref = 0, u_ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      mi[i] = beta1 * m[i] + (1 - beta1) * g[i];
      vi[i] = beta2 * v[i] + (1 - beta2) * double(g[i]) * g[i];
      u[i] = (mi[i] / bc1) / (std::sqrt(vi[i] / bc2) + eps) + wd * p[i];
      p_ref += double(p[i]) * p[i];
      u_ref += u[i] * u[i];
    }
    INFO("isa " << table->name);
    REQUIRE(p_sumsq == Approx(p_ref).epsilon(1e-5));
    REQUIRE(u_sumsq == Approx(u_ref).epsilon(1e-4));
    for (int64_t i = 0; i < n; ++i) {
      REQUIRE(m2[i] == Approx(mi[i]).epsilon(1e-5).margin(1e-7));
      REQUIRE(v2[i] == Approx(vi[i]).epsilon(1e-5).margin(1e-9));
      REQUIRE(p2[i] == p[i]);  // phase 1 leaves the param alone
    }
    const double trust = std::sqrt(p_ref) / std::sqrt(u_ref);
    s.step_size = float(lr * trust);
    table->optim.lamb_phase2(t, h, s, nullptr, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      INFO("i " << i);
      REQUIRE(p2[i] == Approx(p[i] - lr * trust * u[i]).epsilon(1e-5).margin(1e-6));
    }
  }
}

namespace {

/// A one-moment optimizer's step with the hyperparameters of the low-bit test below.
struct OneMomentAlgo {
  const char* name;
  OptimFn OptimKernels::*fn;
  OptimHyper hyper;
};

std::vector<OneMomentAlgo> one_moment_algos() {
  OptimHyper lion{};
  lion.weight_decay = 0.1f, lion.one_minus_beta1 = 0.1f, lion.one_minus_beta2 = 0.01f;
  lion.beta2_f = 0.99f;
  OptimHyper sgd{};
  sgd.weight_decay = 0.01f, sgd.momentum = 0.9f, sgd.one_minus_dampening = 0.9f;
  OptimHyper nesterov = sgd;
  nesterov.one_minus_dampening = 1.f, nesterov.nesterov = true;
  OptimHyper first = sgd;
  first.first_step = true;
  return {{"lion", &OptimKernels::lion, lion},
          {"sgd", &OptimKernels::sgd, sgd},
          {"sgd nesterov", &OptimKernels::sgd, nesterov},
          {"sgd first step", &OptimKernels::sgd, first}};
}

}  // namespace

// The low-bit one-moment steps are the fp32 step on the dequantized moment, requantized: the
// param equals the fp32 kernel's on the decoded moment bit for bit; with int8 codes (blocks of 64,
// a short last one) the absmaxes equal the encoder's of the fp32 kernel's moment and each code is
// one of the two codes around it (stochastic rounding); with bf16 the stored moment is one of its
// two bf16 neighbours. Every ISA writes the same bits.
TEST_CASE("low-bit one-moment steps are the fp32 step on the dequantized moment, on every ISA") {
  const int64_t n = 1000, block = 64;
  const auto tables = runnable_tables();
  for (const OneMomentAlgo& algo : one_moment_algos()) {
    for (StateFormat format : {StateFormat::kInt8, StateFormat::kBFloat16}) {
      const bool int8 = format == StateFormat::kInt8;
      auto p = random_floats(n, 41), g = random_floats(n, 42), m = random_floats(n, 43, 0.1f);
      OptimHyper h = algo.hyper;
      h.state_format = format, h.state_block = int32_t(block);
      StepScalars s{};
      s.lr = 1e-2f, s.grad_scale = 1.f, s.param_decay = float(1 - 1e-2 * 0.1);
      // The starting state: codes of m, or m rounded to bf16.
      std::vector<int8_t> codes0(n);
      std::vector<float> absmax0((n + block - 1) / block);
      std::vector<bf16> m_bf16(n);
      tables[0]->optim.lowbit_encode(m.data(), n, block, true, codes0.data(), absmax0.data());
      for (int64_t i = 0; i < n; ++i) m_bf16[i] = to_bf16(m[i]);
      std::vector<float> first_p;
      std::vector<int8_t> first_codes;
      std::vector<uint16_t> first_bf16;
      for (const CpuKernelTable* table : tables) {
        INFO(algo.name << " isa " << table->name << (int8 ? " int8" : " bf16"));
        // The reference: the fp32 kernel on the dequantized moment.
        std::vector<float> m_ref(n), p_ref = p;
        if (int8) {
          table->optim.lowbit_decode(codes0.data(), true, absmax0.data(), n, block, m_ref.data());
        } else {
          for (int64_t i = 0; i < n; ++i) m_ref[i] = to_float(m_bf16[i]);
        }
        OptimHyper h32 = algo.hyper;
        (table->optim.*algo.fn)(f32_tensor(p_ref.data(), g.data(), n, m_ref.data()), h32, s,
                                nullptr, nullptr);
        // The low-bit step.
        auto p2 = p;
        auto codes = codes0;
        auto absmax = absmax0;
        auto mb = m_bf16;
        OptimTensor t = f32_tensor(p2.data(), g.data(), n);
        t.exp_avg_lp = int8 ? static_cast<void*>(codes.data()) : static_cast<void*>(mb.data());
        t.exp_avg_absmax = int8 ? absmax.data() : nullptr;
        t.sr_salt = 12345u;
        (table->optim.*algo.fn)(t, h, s, nullptr, nullptr);
        for (int64_t i = 0; i < n; ++i) {
          INFO("i " << i);
          REQUIRE(p2[i] == p_ref[i]);
        }
        if (int8) {
          std::vector<int8_t> codes_ref(n);
          std::vector<float> absmax_ref(absmax.size());
          table->optim.lowbit_encode(m_ref.data(), n, block, true, codes_ref.data(),
                                     absmax_ref.data());
          CHECK(absmax == absmax_ref);
          // Rounded stochastically: the nearest code or its neighbour on the other side of the
          // value, both occurring.
          std::vector<float> back(n), nearest(n);
          table->optim.lowbit_decode(codes.data(), true, absmax.data(), n, block, back.data());
          table->optim.lowbit_decode(codes_ref.data(), true, absmax.data(), n, block,
                                     nearest.data());
          int64_t other = 0;
          for (int64_t i = 0; i < n; ++i) {
            INFO("i " << i << " m " << m_ref[i] << " code " << int(codes[i]) << " nearest "
                      << int(codes_ref[i]));
            REQUIRE(std::abs(int(codes[i]) - int(codes_ref[i])) <= 1);
            if (codes[i] != codes_ref[i]) {
              ++other;
              // The two codes bracket the value.
              REQUIRE((back[i] - m_ref[i]) * (nearest[i] - m_ref[i]) <= 0.f);
            }
          }
          CHECK(other > n / 20);
        } else {
          int64_t up = 0;
          for (int64_t i = 0; i < n; ++i) {
            uint32_t u;
            std::memcpy(&u, &m_ref[i], 4);
            const uint32_t down = u >> 16;
            INFO("i " << i);
            REQUIRE((mb[i].bits == down || (mb[i].bits == down + 1 && (u & 0xFFFFu) != 0)));
            up += mb[i].bits != down;
          }
          CHECK(up > n / 5);  // stochastic: both neighbours occur
          CHECK(up < 4 * n / 5);
        }
        // Every ISA writes the first ISA's bits.
        std::vector<uint16_t> bits(n);
        for (int64_t i = 0; i < n; ++i) bits[i] = mb[i].bits;
        if (first_p.empty()) {
          first_p = p2, first_codes = codes, first_bf16 = bits;
        } else {
          CHECK(p2 == first_p);
          CHECK(codes == first_codes);
          CHECK(bits == first_bf16);
        }
      }
    }
  }
}

namespace {

// The resampler's arithmetic written out in int64: sum of taps, plus half, shifted, clamped.
uint8_t reference_tap_sum(const std::vector<int64_t>& values, const int* k) {
  int64_t s = int64_t{1} << (kResamplePrecisionBits - 1);
  for (size_t t = 0; t < values.size(); ++t) s += values[t] * k[t];
  s >>= kResamplePrecisionBits;
  return static_cast<uint8_t>(s < 0 ? 0 : (s > 255 ? 255 : s));
}

// Random taps: `count` weights around 1/count in fixed point, a quarter of them negated, so that
// sums leave [0, 255] both ways and the clamp is exercised. |sum| stays below 2^31 (the kernels'
// int32 range): 255 * count * (2^22 / count + 2^18) < 1.6e9 for count <= 7.
std::vector<int> random_weights(std::mt19937& gen, int count) {
  std::uniform_int_distribution<int> jitter(-(1 << 18), 1 << 18);
  std::vector<int> k(static_cast<size_t>(count));
  for (auto& w : k) {
    w = (1 << kResamplePrecisionBits) / count + jitter(gen);
    if (gen() % 4 == 0) w = -w;
  }
  return k;
}

}  // namespace

TEST_CASE("resampler passes equal an int64 reference on every ISA, bytes identical") {
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> byte(0, 255);
  for (const CpuKernelTable* table : runnable_tables()) {
    for (int src_w : {1, 5, 37, 300}) {
      // Horizontal: every output pixel has its own (first, count) window inside the row.
      std::vector<uint8_t> row(static_cast<size_t>(src_w) * 3);
      for (auto& b : row) b = static_cast<uint8_t>(byte(gen));
      const int out_w = 41, ksize = std::min(src_w, 7);
      std::vector<int> bounds, kk(static_cast<size_t>(out_w * ksize), 0);
      for (int xx = 0; xx < out_w; ++xx) {
        const int count = 1 + static_cast<int>(gen() % static_cast<uint32_t>(ksize));
        const int first = static_cast<int>(gen() % static_cast<uint32_t>(src_w - count + 1));
        bounds.push_back(first);
        bounds.push_back(count);
        const auto w = random_weights(gen, count);
        std::copy(w.begin(), w.end(), kk.begin() + static_cast<ptrdiff_t>(xx * ksize));
      }
      for (int x0 : {0, 3}) {
        std::vector<uint8_t> out(static_cast<size_t>(out_w - x0) * 3);
        table->data.resample_horizontal(row.data(), src_w, bounds.data(), kk.data(), ksize, x0,
                                        out_w, out.data());
        for (int xx = x0; xx < out_w; ++xx) {
          const int first = bounds[static_cast<size_t>(xx) * 2];
          const int count = bounds[static_cast<size_t>(xx) * 2 + 1];
          for (int c = 0; c < 3; ++c) {
            std::vector<int64_t> v;
            for (int t = 0; t < count; ++t)
              v.push_back(row[static_cast<size_t>(first + t) * 3 + c]);
            INFO("isa " << table->name << " src_w " << src_w << " xx " << xx << " c " << c);
            REQUIRE(out[static_cast<size_t>(xx - x0) * 3 + c] ==
                    reference_tap_sum(v, &kk[static_cast<size_t>(xx * ksize)]));
          }
        }
      }
    }
    // Vertical: lengths around every vector width and the 4-vector unroll, a stride wider than the
    // row.
    for (size_t n : {1u, 7u, 8u, 15u, 16u, 17u, 31u, 32u, 33u, 63u, 64u, 65u, 100u, 672u}) {
      const size_t stride = n + 5;
      const int rows = 9;
      std::vector<uint8_t> img(stride * rows);
      for (auto& b : img) b = static_cast<uint8_t>(byte(gen));
      for (int first : {0, 2}) {
        for (int count : {1, 3, 7}) {
          const auto k = random_weights(gen, count);
          std::vector<uint8_t> out(n);
          table->data.resample_vertical(img.data(), stride, first, count, k.data(), n, out.data());
          for (size_t i = 0; i < n; ++i) {
            std::vector<int64_t> v;
            for (int y = 0; y < count; ++y)
              v.push_back(img[static_cast<size_t>(first + y) * stride + i]);
            INFO("isa " << table->name << " n " << n << " i " << i << " count " << count);
            REQUIRE(out[i] == reference_tap_sum(v, k.data()));
          }
        }
      }
    }
  }
}

TEST_CASE(
    "scale_cast (the reducer's bucket pass) rounds once, like the scalar reference, on every ISA") {
  // Reference: fp32 multiply, then one round-to-nearest-even into the output type.
  for (const CpuKernelTable* table : runnable_tables()) {
    for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 31, 33, 1000}) {
      std::vector<float> src =
          random_floats(static_cast<size_t>(n), 7 + static_cast<uint32_t>(n), 50.f);
      if (n > 3) src[1] = INFINITY, src[2] = -0.f, src[3] = 70000.f;  // fp16 overflow -> inf
      const float scale = 0.5f;
      std::vector<bf16> b(static_cast<size_t>(n));
      std::vector<fp16> h(static_cast<size_t>(n));
      std::vector<float> back(static_cast<size_t>(n));
      REQUIRE(
          table->dist.scale_cast(DType::kFloat, src.data(), DType::kBFloat16, b.data(), scale, n));
      REQUIRE(table->dist.scale_cast(DType::kFloat, src.data(), DType::kHalf, h.data(), scale, n));
      REQUIRE(
          table->dist.scale_cast(DType::kBFloat16, b.data(), DType::kFloat, back.data(), 1.0, n));
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = static_cast<size_t>(i);
        INFO(table->name << " n=" << n << " i=" << i);
        REQUIRE(b[k].bits == to_bf16(src[k] * scale).bits);
        REQUIRE(h[k].bits == to_fp16(src[k] * scale).bits);
        REQUIRE(back[k] == to_float(b[k]));  // widening is exact
      }
      // In place, and fp64 in double arithmetic.
      std::vector<float> inplace = src;
      REQUIRE(table->dist.scale_cast(DType::kFloat, inplace.data(), DType::kFloat, inplace.data(),
                                     0.25, n));
      for (size_t k = 0; k < inplace.size(); ++k) REQUIRE(inplace[k] == src[k] * 0.25f);
      std::vector<double> d(static_cast<size_t>(n), 1.0 / 3.0), dout(static_cast<size_t>(n));
      REQUIRE(table->dist.scale_cast(DType::kDouble, d.data(), DType::kDouble, dout.data(),
                                     1.0 / 7.0, n));
      for (size_t k = 0; k < d.size(); ++k) REQUIRE(dout[k] == (1.0 / 3.0) * (1.0 / 7.0));
    }
    // fp64 only pairs with fp64.
    double x = 1;
    float y = 0;
    CHECK_FALSE(table->dist.scale_cast(DType::kDouble, &x, DType::kFloat, &y, 1.0, 1));
    CHECK_FALSE(table->dist.scale_cast(DType::kFloat, &y, DType::kDouble, &x, 1.0, 1));
  }
}

TEST_CASE("int8 quantize/dequantize equal the scalar formula on every ISA, ties to even") {
  for (const CpuKernelTable* table : runnable_tables()) {
    for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 33, 1000}) {
      std::vector<float> x =
          random_floats(static_cast<size_t>(n), 11 + static_cast<uint32_t>(n), 40.f);
      const float ties[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 1e9f, -1e9f, 126.5f, -127.5f};
      for (size_t i = 0; i < x.size() && i < 9; ++i) x[i] = ties[i];
      std::vector<int8_t> q(static_cast<size_t>(n));
      std::vector<bf16> xb(static_cast<size_t>(n));
      std::vector<int8_t> qb(static_cast<size_t>(n));
      std::vector<float> back(static_cast<size_t>(n));
      for (size_t i = 0; i < x.size(); ++i) xb[i] = to_bf16(x[i]);
      for (float zp : {0.f, -7.f}) {
        REQUIRE(table->quant.quantize_int8(DType::kFloat, x.data(), q.data(), n, 1.0f, zp));
        REQUIRE(table->quant.quantize_int8(DType::kBFloat16, xb.data(), qb.data(), n, 0.5f, zp));
        table->quant.dequantize_int8(q.data(), back.data(), n, 0.25f, zp);
        for (size_t i = 0; i < x.size(); ++i) {
          INFO(table->name << " n=" << n << " i=" << i << " x=" << x[i] << " zp=" << zp);
          const auto want = [&](float v, float inv) {
            const float r = std::nearbyint(v * inv) + zp;
            return static_cast<int8_t>(std::min(127.f, std::max(-128.f, r)));
          };
          REQUIRE(q[i] == want(x[i], 1.0f));
          REQUIRE(qb[i] == want(to_float(xb[i]), 0.5f));
          REQUIRE(back[i] == (static_cast<float>(q[i]) - zp) * 0.25f);
        }
      }
    }
    int8_t out = 0;
    double d = 1;
    CHECK_FALSE(table->quant.quantize_int8(DType::kDouble, &d, &out, 1, 1.f, 0.f));
  }
}

// ---- prune: bit-packed masks (kernels/cpu/prune.h) ----------------------------------------------

TEST_CASE("prune kernels: pack/unpack round trip, apply bit-exact, N:M and threshold masks") {
  for (const CpuKernelTable* table : runnable_tables()) {
    const auto& k = table->prune;
    for (int64_t n : {0, 1, 7, 8, 9, 16, 17, 63, 64, 65, 1000, 4099}) {
      INFO("isa " << table->name << " n " << n);
      std::mt19937 gen(static_cast<uint32_t>(n) + 7u);
      std::vector<uint8_t> bools(n), back(n), bits((n + 7) / 8, 0xaa);
      for (auto& b : bools) b = gen() % 3 ? 1 : 0;
      k.pack_mask(bools.data(), bits.data(), n);
      for (int64_t i = 0; i < n; ++i) REQUIRE(((bits[i / 8] >> (i % 8)) & 1) == bools[i]);
      if (n % 8) REQUIRE((bits.back() >> (n % 8)) == 0);  // bits past n are 0
      k.unpack_mask(bits.data(), back.data(), n);
      REQUIRE(back == bools);
      // apply: float32 (the vector path), 2- and 8-byte elements; kept bits untouched (NaN too).
      auto w = random_floats(static_cast<size_t>(n), 99u);
      if (n > 3) w[3] = std::nanf("0x123");
      auto w2 = w;
      k.apply_mask(w2.data(), 4, bits.data(), n);
      std::vector<uint16_t> h(n, 0x3c00u);
      std::vector<uint64_t> d(n, 0x3ff0000000000000ull);
      k.apply_mask(h.data(), 2, bits.data(), n);
      k.apply_mask(d.data(), 8, bits.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        uint32_t a, b;
        std::memcpy(&a, &w[i], 4);
        std::memcpy(&b, &w2[i], 4);
        REQUIRE(b == (bools[i] ? a : 0u));
        REQUIRE(h[i] == (bools[i] ? 0x3c00u : 0u));
        REQUIRE(d[i] == (bools[i] ? 0x3ff0000000000000ull : 0ull));
      }
    }
    // N:M against a sort-based reference (ties: the lower index ranks first).
    for (auto [nn, m] : {std::pair{2, 4}, {1, 4}, {4, 8}, {3, 7}, {0, 4}, {4, 4}, {5, 16}}) {
      const int64_t groups = 37;
      const int64_t total = groups * m;
      auto w = random_floats(static_cast<size_t>(total), 5u);
      for (int64_t i = 0; i < total; i += 5) w[i] = (i % 2 ? -0.5f : 0.5f);  // ties, both signs
      std::vector<uint8_t> bits((total + 7) / 8, 0xff);
      k.nm_mask(w.data(), 4, groups, nn, m, bits.data());
      for (int64_t g = 0; g < groups; ++g) {
        std::vector<int> idx(m);
        for (int j = 0; j < m; ++j) idx[j] = j;
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
          return std::fabs(w[g * m + a]) > std::fabs(w[g * m + b]);
        });
        std::vector<bool> keep(m, false);
        for (int j = 0; j < nn; ++j) keep[idx[j]] = true;
        for (int j = 0; j < m; ++j) {
          const int64_t i = g * m + j;
          INFO("isa " << table->name << " " << nn << ":" << m << " group " << g << " j " << j);
          REQUIRE(bool((bits[i / 8] >> (i % 8)) & 1) == keep[j]);
        }
      }
    }
    // threshold: keep key > t and the first `ties_kept` ties.
    std::vector<float> w = {1.f, -2.f, 2.f, 0.5f, 2.f, -3.f, 2.f, 0.f, 2.f};
    uint32_t t;
    const float two = 2.f;
    std::memcpy(&t, &two, 4);
    REQUIRE(k.count_key(w.data(), 4, 9, t) == 5);
    std::vector<uint8_t> bits(2);
    k.threshold_mask(w.data(), 4, 9, t, 2, bits.data());
    // kept: -2 (idx 1), 2 (idx 2) as the first two ties, -3 (idx 5).
    REQUIRE(bits[0] == uint8_t((1u << 1) | (1u << 2) | (1u << 5)));
    REQUIRE(bits[1] == 0);
  }
}

TEST_CASE("fake-quant and its backward equal the int64/double formula on every ISA") {
  for (const CpuKernelTable* table : runnable_tables()) {
    for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 33, 1000}) {
      std::vector<float> x =
          random_floats(static_cast<size_t>(n), 21 + static_cast<uint32_t>(n), 60.f);
      const float ties[] = {0.5f, 1.5f, 2.5f, -0.5f, 1e30f, -1e30f, 126.5f, -128.5f, 3.5f};
      for (size_t i = 0; i < x.size() && i < 9; ++i) x[i] = ties[i];
      std::vector<bf16> xb(static_cast<size_t>(n)), yb(static_cast<size_t>(n));
      for (size_t i = 0; i < x.size(); ++i) xb[i] = to_bf16(x[i]);
      std::vector<float> y(static_cast<size_t>(n)), g(static_cast<size_t>(n)),
          gx(static_cast<size_t>(n));
      std::vector<uint8_t> mask(static_cast<size_t>(n)), maskb(static_cast<size_t>(n));
      for (size_t i = 0; i < g.size(); ++i) g[i] = x[i] * 0.5f - 1.f;
      for (const float zp : {0.f, 9.f}) {
        for (const float qmax : {127.f, 7.f}) {
          const float qmin = qmax == 7.f ? -8.f : -128.f, scale = 0.5f, inv = 2.f;
          REQUIRE(table->quant.fake_quantize(DType::kFloat, x.data(), y.data(), mask.data(), n,
                                             scale, inv, zp, qmin, qmax));
          REQUIRE(table->quant.fake_quantize(DType::kBFloat16, xb.data(), yb.data(), maskb.data(),
                                             n, scale, inv, zp, qmin, qmax));
          REQUIRE(table->quant.fake_quantize_backward(DType::kFloat, g.data(), mask.data(),
                                                      gx.data(), n));
          for (size_t i = 0; i < x.size(); ++i) {
            INFO(table->name << " n=" << n << " i=" << i << " x=" << x[i] << " zp=" << zp);
            // torch's definition: an int64 q before the clamp, the product in double
            const auto want = [&](float v, double& out) {
              const double r = std::nearbyint(static_cast<double>(v) * inv) + zp;
              const bool in = r >= qmin && r <= qmax;
              out = (std::min<double>(qmax, std::max<double>(qmin, r)) - zp) * scale;
              return in;
            };
            double wy = 0;
            const bool in = want(x[i], wy);
            REQUIRE(y[i] == static_cast<float>(wy));
            REQUIRE(mask[i] == (in ? 1 : 0));
            REQUIRE(gx[i] == (in ? g[i] : 0.f * g[i]));
            const bool inb = want(to_float(xb[i]), wy);
            REQUIRE(to_float(yb[i]) == to_float(to_bf16(static_cast<float>(wy))));
            REQUIRE(maskb[i] == (inb ? 1 : 0));
          }
        }
      }
    }
    double d = 1;
    uint8_t m = 0;
    CHECK_FALSE(table->quant.fake_quantize(DType::kDouble, &d, &d, &m, 1, 1.f, 1.f, 0.f, 0.f, 1.f));
    CHECK_FALSE(table->quant.fake_quantize_backward(DType::kDouble, &d, &m, &d, 1));
  }
}
