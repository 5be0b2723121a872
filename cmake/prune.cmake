# The prune area (torchspeed.prune, include/torchspeed/prune.h): mask selection (N:M and
# exact-count magnitude) through the op recipe, CPU kernels in the ISA table (kernels/cpu/prune.h)
# and CUDA kernels (prune.cu). The packed-mask format itself (pack/unpack, in-place apply) is built
# with the optimizers, whose steps read it (cmake/optim.cmake). Every file of the area carries its
# name and is listed here, explicitly. Included by CMakeLists.txt when
# TORCHSPEED_WITH_PRUNE is on (cmake/areas.txt).
set(_ts_root "${CMAKE_CURRENT_LIST_DIR}/..")
set(TORCHSPEED_PRUNE_SOURCES
  "${_ts_root}/csrc/ops/prune.cpp"
  "${_ts_root}/csrc/ops/cpu/prune_cpu.cpp"
  "${_ts_root}/csrc/ops/meta/prune_meta.cpp"
)
set(TORCHSPEED_PRUNE_CUDA_SOURCES
  "${_ts_root}/csrc/kernels/cuda/prune.cu"
  "${_ts_root}/csrc/ops/cuda/prune_cuda.cpp"
)
set(TORCHSPEED_PRUNE_PYTHON_SOURCES "")
set(TORCHSPEED_PRUNE_TEST_SOURCES "${_ts_root}/tests/cpp/prune/test_prune.cpp")
set(TORCHSPEED_PRUNE_INCLUDE_DIRS "")
set(TORCHSPEED_PRUNE_LIBS "")
set(TORCHSPEED_PRUNE_DEFINITIONS "")
set(TORCHSPEED_PRUNE_FEATURES prune nm_sparsity)
torchspeed_area(prune)
unset(_ts_root)
