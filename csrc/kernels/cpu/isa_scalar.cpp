// CPU kernels compiled for any x86-64/ARM CPU (no vector extensions assumed).
#define TORCHSPEED_CPU_ISA_VEC ScalarVec<float>
#define TORCHSPEED_CPU_ISA_ENUM Isa::kScalar
#define TORCHSPEED_CPU_ISA_NAME "scalar"
#define TORCHSPEED_CPU_ISA_TABLE_FN cpu_kernels_scalar
#include "kernels/cpu/isa_unit.inc"
