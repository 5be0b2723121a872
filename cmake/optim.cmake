# The optimizer area (torchspeed.optim, torchspeed.ops, include/torchspeed/optim/, ops.h): the fused
# optimizer steps and grad_stats, their schemas, validators and per-key adapters, and the C++
# optimizers. Always built. Included by CMakeLists.txt like every cmake/<area>.cmake: sets
# TORCHSPEED_OPTIM_* and registers with torchspeed_area(). It creates no targets.
# Every list is explicit: the folders csrc/ops/<key>/ and csrc/kernels/cuda/ hold the files of
# every area, and each area's cmake file names its own (an area turned OFF builds none of them).
set(_ts_root "${CMAKE_CURRENT_LIST_DIR}/..")
set(TORCHSPEED_OPTIM_SOURCES
  "${_ts_root}/csrc/ops/registration.cpp"
  "${_ts_root}/csrc/ops/optim.cpp"
  "${_ts_root}/csrc/ops/fused_step.cpp"
  "${_ts_root}/csrc/ops/cpu/grad_stats_cpu.cpp"
  "${_ts_root}/csrc/ops/cpu/optim_cpu.cpp"
  "${_ts_root}/csrc/ops/meta/grad_stats_meta.cpp"
  "${_ts_root}/csrc/ops/meta/optim_meta.cpp"
  "${_ts_root}/csrc/optim/fused_optimizers.cpp"
  "${_ts_root}/csrc/optim/hyperparams.cpp"
  "${_ts_root}/csrc/optim/lr_scheduler.cpp"
)
set(TORCHSPEED_OPTIM_CUDA_SOURCES
  "${_ts_root}/csrc/kernels/cuda/grad_stats.cu"
  "${_ts_root}/csrc/kernels/cuda/optim.cu"
  "${_ts_root}/csrc/ops/cuda/grad_stats_cuda.cpp"
  "${_ts_root}/csrc/ops/cuda/optim_cuda.cpp"
)
set(TORCHSPEED_OPTIM_PYTHON_SOURCES "${_ts_root}/csrc/python/optim_bindings.cpp")
set(TORCHSPEED_OPTIM_TEST_SOURCES
  "${_ts_root}/tests/cpp/test_ops_args.cpp"
  "${_ts_root}/tests/cpp/test_ops_grad_stats.cpp"
  "${_ts_root}/tests/cpp/test_optim_cpp_api.cpp"
  "${_ts_root}/tests/cpp/test_optim_cpp_parity.cpp"
  "${_ts_root}/tests/cpp/test_optim_lr_scheduler.cpp"
)
set(TORCHSPEED_OPTIM_FEATURES optim)
torchspeed_area(optim)
unset(_ts_root)
