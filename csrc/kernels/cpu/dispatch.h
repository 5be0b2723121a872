// Run-time choice of the CPU kernel table: the best ISA the CPU supports and the build compiled,
// unless TORCHSPEED_CPU_ISA=scalar|avx2|avx512|avx512_vnni|amx|auto asks for another (read at
// every call, so a test can switch paths in one process). avx512_vnni and amx differ from avx512
// only in the int8 Linear's kernels; detecting amx asks the OS for the tile permission (falling
// back to avx512_vnni when refused).
#pragma once

#include <string>
#include <vector>

#include "kernels/cpu/types.h"

namespace torchspeed::kernels::cpu {

/// The ISA the kernels run with now. Throws std::invalid_argument for a bad TORCHSPEED_CPU_ISA
/// and std::runtime_error when it names an ISA this CPU or this build lacks.
const CpuKernelTable& cpu_kernels();

/// The table of one ISA, or null when this build lacks it or this CPU cannot run it.
const CpuKernelTable* cpu_kernels_for(Isa isa);

/// Best ISA this CPU supports (whatever the build compiled).
Isa detected_isa();
/// ISAs this build compiled kernels for, slowest first.
std::vector<Isa> compiled_isas();
/// "scalar", "avx2", "avx512", "avx512_vnni", "amx".
const char* isa_name(Isa isa);
/// Why this process cannot run the amx level ("" when it can): the CPU, the build, or the kernel
/// refusing the tile permission (requested once, at the first detection).
std::string amx_status();

}  // namespace torchspeed::kernels::cpu
