// CPU kernels compiled with -mavx512f/bw/vl/dq; only called when the CPU reports all four.
#define TORCHSPEED_CPU_ISA_VEC VecAvx512
#define TORCHSPEED_CPU_ISA_ENUM Isa::kAvx512
#define TORCHSPEED_CPU_ISA_NAME "avx512"
#define TORCHSPEED_CPU_ISA_TABLE_FN cpu_kernels_avx512
#include "kernels/cpu/isa_unit.inc"
