// CPU kernels compiled with -mavx2 -mfma -mf16c; only called when the CPU reports all three.
#define TORCHSPEED_CPU_ISA_VEC VecAvx2
#define TORCHSPEED_CPU_ISA_ENUM Isa::kAvx2
#define TORCHSPEED_CPU_ISA_NAME "avx2"
#define TORCHSPEED_CPU_ISA_TABLE_FN cpu_kernels_avx2
#include "kernels/cpu/isa_unit.inc"
