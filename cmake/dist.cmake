# The dist area (torchspeed.dist, include/torchspeed/dist/): AccumulatingDDP, the gradient reducer,
# ZeRO-1's ZeroShards/ZeroOptimizer (csrc/dist/zero.cpp)
# over torch's own c10d process groups (Gloo on CPUs, NCCL in CUDA builds of torch), and its bucket
# op scale_cast_ (CPU SIMD kernel in the ISA table, CUDA kernel). Needs nothing beyond LibTorch.
# Included by CMakeLists.txt when TORCHSPEED_WITH_DIST is on (cmake/areas.txt): sets
# TORCHSPEED_DIST_* and registers with torchspeed_area().
set(_ts_root "${CMAKE_CURRENT_LIST_DIR}/..")
find_path(TORCHSPEED_C10D_INCLUDE_DIR torch/csrc/distributed/c10d/ProcessGroup.hpp
  HINTS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(NOT TORCHSPEED_C10D_INCLUDE_DIR)
  message(FATAL_ERROR "torchspeed.dist: this torch has no c10d headers "
    "(torch/csrc/distributed/c10d/ProcessGroup.hpp: a torch built without USE_DISTRIBUTED). "
    "Build without the area: -DTORCHSPEED_WITH_DIST=OFF (pip: TORCHSPEED_WITH_DIST=OFF pip install ...).")
endif()
set(TORCHSPEED_DIST_SOURCES
  "${_ts_root}/csrc/dist/process_group.cpp"
  "${_ts_root}/csrc/dist/reducer.cpp"
  "${_ts_root}/csrc/dist/zero.cpp"
  "${_ts_root}/csrc/ops/dist.cpp"
  "${_ts_root}/csrc/ops/cpu/dist_cpu.cpp"
  "${_ts_root}/csrc/ops/meta/dist_meta.cpp"
)
set(TORCHSPEED_DIST_CUDA_SOURCES
  "${_ts_root}/csrc/kernels/cuda/dist_bucket.cu"
  "${_ts_root}/csrc/ops/cuda/dist_cuda.cpp"
)
set(TORCHSPEED_DIST_INCLUDE_DIRS "")
set(TORCHSPEED_DIST_PYTHON_SOURCES "${_ts_root}/csrc/python/dist_bindings.cpp")
set(TORCHSPEED_DIST_TEST_SOURCES "${_ts_root}/tests/cpp/dist/test_dist.cpp"
  "${_ts_root}/tests/cpp/dist/test_zero.cpp")
set(TORCHSPEED_DIST_LIBS "")
set(TORCHSPEED_DIST_DEFINITIONS "")
set(TORCHSPEED_DIST_FEATURES dist gloo)
# torch's ProcessGroupGloo.hpp includes Gloo's headers, which the torch wheel lacks: with them
# (Debian: libgloo-dev), torchspeed::dist::new_gloo_group lets C++ apps make a Gloo group without
# needing them themselves (feature gloo-cpp); without, it throws a clear error.
find_path(TORCHSPEED_GLOO_INCLUDE_DIR gloo/context.h)
if(TORCHSPEED_GLOO_INCLUDE_DIR)
  list(APPEND TORCHSPEED_DIST_INCLUDE_DIRS "${TORCHSPEED_GLOO_INCLUDE_DIR}")
  list(APPEND TORCHSPEED_DIST_FEATURES gloo-cpp)
else()
  message(STATUS "torchspeed.dist: Gloo headers not found (gloo/context.h; Debian: libgloo-dev): "
    "C++ apps create their process groups themselves (new_gloo_group throws)")
endif()
if(TORCHSPEED_CUDA_ENABLED)
  list(APPEND TORCHSPEED_DIST_FEATURES nccl)
endif()
torchspeed_area(dist)
unset(_ts_root)
