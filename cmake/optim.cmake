# The optimizer area (torchspeed.optim, torchspeed.ops, include/torchspeed/optim/, ops.h): the fused
# optimizer steps and grad_stats, their schemas, validators and per-key adapters, and the C++
# optimizers. Always built. Included by CMakeLists.txt like every cmake/<area>.cmake: sets
# TORCHSPEED_OPTIM_* and registers with torchspeed_area(). It creates no targets.
set(_ts_root "${CMAKE_CURRENT_LIST_DIR}/..")
file(GLOB TORCHSPEED_OPTIM_SOURCES CONFIGURE_DEPENDS
  "${_ts_root}/csrc/ops/*.cpp" "${_ts_root}/csrc/ops/cpu/*.cpp" "${_ts_root}/csrc/ops/meta/*.cpp"
  "${_ts_root}/csrc/optim/*.cpp")
file(GLOB TORCHSPEED_OPTIM_CUDA_SOURCES CONFIGURE_DEPENDS
  "${_ts_root}/csrc/kernels/cuda/*.cu" "${_ts_root}/csrc/ops/cuda/*.cpp")
# The dist and quant areas' op files share these folders (ops/<key>/{dist,quant}_*.cpp,
# kernels/cuda/{bucket,quant}.cu): cmake/dist.cmake and cmake/quant.cmake own them.
list(FILTER TORCHSPEED_OPTIM_SOURCES EXCLUDE REGEX "/ops/(cpu/|meta/|cuda/)?(dist|quant)[_.][^/]*$")
list(FILTER TORCHSPEED_OPTIM_CUDA_SOURCES EXCLUDE REGEX
     "/(ops/cuda/(dist|quant)_[^/]*|kernels/cuda/(bucket|quant)\\.cu)$")
set(TORCHSPEED_OPTIM_PYTHON_SOURCES "${_ts_root}/csrc/python/optim_bindings.cpp")
file(GLOB TORCHSPEED_OPTIM_TEST_SOURCES CONFIGURE_DEPENDS
  "${_ts_root}/tests/cpp/test_ops_*.cpp" "${_ts_root}/tests/cpp/test_optim_*.cpp")
set(TORCHSPEED_OPTIM_FEATURES optim)
torchspeed_area(optim)
unset(_ts_root)
