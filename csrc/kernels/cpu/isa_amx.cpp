// The int8 Linear's kernels compiled with AVX-512 + VNNI + AMX-INT8 (tdpbssd); the rest of the
// amx table is the avx512 unit's (dispatch.cpp). Only called when the CPU reports AMX-INT8 and
// the kernel granted this process the tile data permission.
#include "kernels/cpu/quant_int8_gemm.h"

namespace torchspeed::kernels::cpu {

Int8LinearKernels int8_linear_kernels_amx() {
  return TORCHSPEED_CPU_ISA_NAMESPACE::int8::int8_linear_kernels();
}

}  // namespace torchspeed::kernels::cpu
