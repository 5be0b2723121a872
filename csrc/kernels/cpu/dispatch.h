// Run-time choice of the CPU kernel table: the best ISA the CPU supports and the build compiled,
// unless TORCHSPEED_CPU_ISA=scalar|avx2|avx512|auto asks for another (read at every call, so a
// test can switch paths in one process).
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
/// "scalar", "avx2", "avx512".
const char* isa_name(Isa isa);

}  // namespace torchspeed::kernels::cpu
