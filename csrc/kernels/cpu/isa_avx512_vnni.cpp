// The int8 Linear's kernels compiled with AVX-512 + VNNI (vpdpbusd); the rest of the
// avx512_vnni table is the avx512 unit's (dispatch.cpp). Only called when the CPU reports VNNI.
#include "kernels/cpu/quant_int8_gemm.h"

namespace torchspeed::kernels::cpu {

Int8LinearKernels int8_linear_kernels_avx512_vnni() {
  return TORCHSPEED_CPU_ISA_NAMESPACE::int8::int8_linear_kernels();
}

}  // namespace torchspeed::kernels::cpu
