# The quant area (torchspeed.quant, include/torchspeed/ops/quant.h): int8 affine quantize and
# dequantize (per tensor, per channel, per group; symmetric or with a zero point) through the op
# recipe, CPU kernels in the ISA table (kernels/cpu/quant.h) and CUDA kernels (quant.cu), fake-quant
# and the int8 Linear. Included by CMakeLists.txt when TORCHSPEED_WITH_QUANT is on (cmake/areas.txt).
set(_ts_root "${CMAKE_CURRENT_LIST_DIR}/..")
set(TORCHSPEED_QUANT_SOURCES
  "${_ts_root}/csrc/ops/quant.cpp"
  "${_ts_root}/csrc/ops/cpu/quant_cpu.cpp"
  "${_ts_root}/csrc/ops/cpu/int8_linear_cpu.cpp"
  "${_ts_root}/csrc/quant/linear.cpp"
  "${_ts_root}/csrc/ops/meta/quant_meta.cpp"
)
set(TORCHSPEED_QUANT_CUDA_SOURCES
  "${_ts_root}/csrc/kernels/cuda/quant.cu"
  "${_ts_root}/csrc/kernels/cuda/fake_quant.cu"
  "${_ts_root}/csrc/kernels/cuda/int8_linear.cu"
  "${_ts_root}/csrc/ops/cuda/quant_cuda.cpp"
  "${_ts_root}/csrc/ops/cuda/int8_linear_cuda.cpp"
)
set(TORCHSPEED_QUANT_PYTHON_SOURCES "")
file(GLOB TORCHSPEED_QUANT_TEST_SOURCES CONFIGURE_DEPENDS "${_ts_root}/tests/cpp/quant/*.cpp")
set(TORCHSPEED_QUANT_INCLUDE_DIRS "")
set(TORCHSPEED_QUANT_LIBS "")
set(TORCHSPEED_QUANT_DEFINITIONS "")
set(TORCHSPEED_QUANT_FEATURES quant int8)
torchspeed_area(quant)
unset(_ts_root)
