// Run-time CPU ISA detection and the choice of kernel table (see dispatch.h).
#include "kernels/cpu/dispatch.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
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
// The int8 Linear's VNNI / AMX kernels (isa_avx512_vnni.cpp, isa_amx.cpp): the avx512_vnni and amx
// tables are the avx512 table with these in quant.int8_linear.
#if defined(TORCHSPEED_HAVE_AVX512_UNIT) && defined(TORCHSPEED_HAVE_AVX512_VNNI_UNIT)
#define TORCHSPEED_HAVE_VNNI_TABLE 1
Int8LinearKernels int8_linear_kernels_avx512_vnni();
#endif
#if defined(TORCHSPEED_HAVE_VNNI_TABLE) && defined(TORCHSPEED_HAVE_AMX_UNIT)
#define TORCHSPEED_HAVE_AMX_TABLE 1
Int8LinearKernels int8_linear_kernels_amx();
#endif

namespace {

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni, Isa::kAmx};

#if defined(__x86_64__) || defined(__i386__)
// F16C from cpuid directly: clang's __builtin_cpu_supports does not know "f16c".
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

#if defined(__x86_64__) || defined(__i386__)
// cpuid leaf 7: ECX bit 11 AVX512_VNNI; EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
bool has_avx512_vnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (c & (1u << 11)) != 0;
}
bool has_amx_int8() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  return (d & (1u << 24)) != 0 && (d & (1u << 25)) != 0;
}
#endif

/// Why the amx level is not runnable ("" when it is), set once by detect().
std::string& amx_note() {
  static std::string note;
  return note;
}

/// Asks Linux for the AMX tile data permission (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 18), once
/// per process; false (with the reason in amx_note) when refused or unsupported.
bool request_amx_permission() {
  // Test hook: behave as a kernel that refuses (tests/python/quant/test_linear.py runs it in a
  // child process).
  if (const char* deny = std::getenv("TORCHSPEED_TEST_DENY_AMX"); deny && *deny && *deny != '0') {
    amx_note() = "the AMX tile permission was refused (TORCHSPEED_TEST_DENY_AMX)";
    return false;
  }
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return true;
  amx_note() = std::string("the kernel refused the AMX tile permission (arch_prctl: ") +
               std::strerror(errno) + ")";
  return false;
#else
  amx_note() = "AMX needs Linux (arch_prctl tile permission)";
  return false;
#endif
}

Isa detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    if (!has_avx512_vnni()) {
      amx_note() = "this CPU lacks AVX512-VNNI and AMX-INT8";
      return Isa::kAvx512;
    }
    if (!has_amx_int8()) {
      amx_note() = "this CPU lacks AMX-INT8";
      return Isa::kAvx512Vnni;
    }
#if defined(TORCHSPEED_HAVE_AMX_TABLE)
    return request_amx_permission() ? Isa::kAmx : Isa::kAvx512Vnni;
#else
    amx_note() = "this build has no AMX unit (compiler lacks -mamx-int8)";
    return Isa::kAmx;  // the CPU has it; table_for() finds no table
#endif
  }
  amx_note() = "this CPU lacks AVX-512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) {
    return Isa::kAvx2;
  }
#endif
  if (amx_note().empty()) amx_note() = "not an x86-64 CPU";
  return Isa::kScalar;
}

/// The avx512 table with another int8 Linear path.
CpuKernelTable with_int8(const CpuKernelTable& base, Isa isa, const char* name,
                         const Int8LinearKernels& k) {
  CpuKernelTable t = base;
  t.isa = isa;
  t.name = name;
  t.quant.int8_linear = k;
  return t;
}

const CpuKernelTable* table_for(Isa isa) {
  switch (isa) {
#if defined(TORCHSPEED_HAVE_AMX_TABLE)
    case Isa::kAmx: {
      static const CpuKernelTable t =
          with_int8(*cpu_kernels_avx512(), Isa::kAmx, "amx", int8_linear_kernels_amx());
      return &t;
    }
#endif
#if defined(TORCHSPEED_HAVE_VNNI_TABLE)
    case Isa::kAvx512Vnni: {
      static const CpuKernelTable t = with_int8(*cpu_kernels_avx512(), Isa::kAvx512Vnni,
                                                "avx512_vnni", int8_linear_kernels_avx512_vnni());
      return &t;
    }
#endif
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
    case Isa::kAvx512Vnni:
      return "avx512_vnni";
    case Isa::kAmx:
      return "amx";
  }
  return "unknown";
}

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

std::string amx_status() {
  const Isa isa = detected_isa();
  if (isa == Isa::kAmx && table_for(Isa::kAmx) != nullptr) return "";
  return amx_note();
}

const CpuKernelTable* cpu_kernels_for(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_isa())) return nullptr;
  return table_for(isa);
}

std::vector<Isa> compiled_isas() {
  std::vector<Isa> out;
  for (Isa isa : kAllIsas) {
    if (table_for(isa) != nullptr) out.push_back(isa);
  }
  return out;
}

const CpuKernelTable& cpu_kernels() {
  static const CpuKernelTable* const automatic = table_for(best_available());
  const char* env = std::getenv("TORCHSPEED_CPU_ISA");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return *automatic;
  Isa wanted = Isa::kScalar;
  bool known = false;
  for (Isa isa : kAllIsas) {
    if (std::strcmp(env, isa_name(isa)) == 0) {
      wanted = isa;
      known = true;
    }
  }
  if (!known) {
    throw std::invalid_argument(std::string("torchspeed: TORCHSPEED_CPU_ISA must be one of "
                                            "auto, scalar, avx2, avx512, avx512_vnni, amx, got '") +
                                env + "'");
  }
  if (static_cast<int>(wanted) > static_cast<int>(detected_isa())) {
    throw std::runtime_error(std::string("torchspeed: TORCHSPEED_CPU_ISA=") + env +
                             " but this CPU supports at most " + isa_name(detected_isa()) +
                             (wanted == Isa::kAmx ? " (" + amx_note() + ")" : std::string()));
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
