// Run-time CPU ISA detection and the choice of kernel table (see dispatch.h).
#include "kernels/cpu/dispatch.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace torchspeed::kernels::cpu {

// Defined by isa_scalar.cpp / isa_avx2.cpp / isa_avx512.cpp; the vector ones only on x86-64.
const CpuKernelTable* cpu_kernels_scalar();
#if defined(TORCHSPEED_HAVE_AVX2_UNIT)
const CpuKernelTable* cpu_kernels_avx2();
#endif
#if defined(TORCHSPEED_HAVE_AVX512_UNIT)
const CpuKernelTable* cpu_kernels_avx512();
#endif

namespace {

#if defined(__x86_64__) || defined(__i386__)
// F16C from cpuid directly: clang's __builtin_cpu_supports does not know "f16c".
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

Isa detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) {
    return Isa::kAvx2;
  }
#endif
  return Isa::kScalar;
}

const CpuKernelTable* table_for(Isa isa) {
  switch (isa) {
#if defined(TORCHSPEED_HAVE_AVX512_UNIT)
    case Isa::kAvx512:
      return cpu_kernels_avx512();
#endif
#if defined(TORCHSPEED_HAVE_AVX2_UNIT)
    case Isa::kAvx2:
      return cpu_kernels_avx2();
#endif
    case Isa::kScalar:
      return cpu_kernels_scalar();
    default:
      return nullptr;
  }
}

Isa best_available() {
  const Isa cpu = detected_isa();
  for (int i = static_cast<int>(cpu); i >= 0; --i) {
    if (table_for(static_cast<Isa>(i)) != nullptr) return static_cast<Isa>(i);
  }
  return Isa::kScalar;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

const CpuKernelTable* cpu_kernels_for(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_isa())) return nullptr;
  return table_for(isa);
}

std::vector<Isa> compiled_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (table_for(isa) != nullptr) out.push_back(isa);
  }
  return out;
}

const CpuKernelTable& cpu_kernels() {
  static const CpuKernelTable* const automatic = table_for(best_available());
  const char* env = std::getenv("TORCHSPEED_CPU_ISA");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return *automatic;
  Isa wanted;
  if (std::strcmp(env, "scalar") == 0) {
    wanted = Isa::kScalar;
  } else if (std::strcmp(env, "avx2") == 0) {
    wanted = Isa::kAvx2;
  } else if (std::strcmp(env, "avx512") == 0) {
    wanted = Isa::kAvx512;
  } else {
    throw std::invalid_argument(std::string("torchspeed: TORCHSPEED_CPU_ISA must be one of "
                                            "auto, scalar, avx2, avx512, got '") +
                                env + "'");
  }
  if (static_cast<int>(wanted) > static_cast<int>(detected_isa())) {
    throw std::runtime_error(std::string("torchspeed: TORCHSPEED_CPU_ISA=") + env +
                             " but this CPU supports at most " + isa_name(detected_isa()));
  }
  const CpuKernelTable* table = table_for(wanted);
  if (table == nullptr) {
    throw std::runtime_error(
        std::string("torchspeed: TORCHSPEED_CPU_ISA=") + env +
        " but this build has no kernels for it (compiler or platform lacks it)");
  }
  return *table;
}

}  // namespace torchspeed::kernels::cpu
