# The quant area (torchspeed.quant, include/torchspeed/quant.h): int8 affine quantize and dequantize
# (per tensor, per channel, per group; symmetric or with a zero point), fake-quant with its STE
# backward, and the int8 Linear (packed weights, exact int32 GEMM, fused epilogue; the C++ module
# torchspeed::quant::Int8Linear), through the op recipe. Every file of the area carries its name
# (quant*.{h,cpp,cu,cuh}, csrc/quant/, tests/cpp/quant/) and is listed here, explicitly. The CPU
# kernels are in the ISA table (kernels/cpu/quant.h, quant_int8_gemm.h: compiled by the ISA units,
# which the core builds). Included by CMakeLists.txt when
# TORCHSPEED_WITH_QUANT is on (cmake/areas.txt).
set(_ts_root "${CMAKE_CURRENT_LIST_DIR}/..")
set(TORCHSPEED_QUANT_SOURCES
  "${_ts_root}/csrc/ops/quant.cpp"
  "${_ts_root}/csrc/ops/cpu/quant_cpu.cpp"
  "${_ts_root}/csrc/ops/cpu/quant_int8_linear_cpu.cpp"
  "${_ts_root}/csrc/quant/linear.cpp"
  "${_ts_root}/csrc/ops/meta/quant_meta.cpp"
)
set(TORCHSPEED_QUANT_CUDA_SOURCES
  "${_ts_root}/csrc/kernels/cuda/quant.cu"
  "${_ts_root}/csrc/kernels/cuda/quant_fake_quant.cu"
  "${_ts_root}/csrc/kernels/cuda/quant_int8_linear.cu"
  "${_ts_root}/csrc/ops/cuda/quant_cuda.cpp"
  "${_ts_root}/csrc/ops/cuda/quant_int8_linear_cuda.cpp"
)
set(TORCHSPEED_QUANT_PYTHON_SOURCES "${_ts_root}/csrc/python/quant_bindings.cpp")
set(TORCHSPEED_QUANT_TEST_SOURCES
  "${_ts_root}/tests/cpp/quant/test_quant.cpp"
  "${_ts_root}/tests/cpp/quant/test_int8_linear.cpp"
)
set(TORCHSPEED_QUANT_INCLUDE_DIRS "")
set(TORCHSPEED_QUANT_LIBS "")
set(TORCHSPEED_QUANT_DEFINITIONS "")
set(TORCHSPEED_QUANT_FEATURES quant int8)
torchspeed_area(quant)
unset(_ts_root)
