# The optimizer area (torchspeed.optim, torchspeed.ops, include/torchspeed/optim/, ops.h): the fused
# optimizer steps and grad_stats, the packed-mask ops their steps read (pack_mask, unpack_mask,
# apply_mask_; torchspeed.prune selects masks over them), their schemas, validators and per-key
# adapters, and the C++ optimizers. Always built. Included by CMakeLists.txt like every
# cmake/<area>.cmake: sets TORCHSPEED_OPTIM_* and registers with torchspeed_area(). It creates no
# targets. Every file is listed by name: a file of another area in these folders is never built here.
set(_ts_root "${CMAKE_CURRENT_LIST_DIR}/..")
set(TORCHSPEED_OPTIM_SOURCES
  # the op library (TORCH_LIBRARY claims the namespace; every area's ops are fragments of it)
  "${_ts_root}/csrc/ops/registration.cpp"
  # ops: the fused steps, grad_stats and the packed masks
  "${_ts_root}/csrc/ops/optim.cpp"
  "${_ts_root}/csrc/ops/fused_step.cpp"
  "${_ts_root}/csrc/ops/mask.cpp"
  "${_ts_root}/csrc/ops/cpu/optim_cpu.cpp"
  "${_ts_root}/csrc/ops/cpu/grad_stats_cpu.cpp"
  "${_ts_root}/csrc/ops/cpu/mask_cpu.cpp"
  "${_ts_root}/csrc/ops/meta/optim_meta.cpp"
  "${_ts_root}/csrc/ops/meta/grad_stats_meta.cpp"
  "${_ts_root}/csrc/ops/meta/mask_meta.cpp"
  # the C++ optimizers: option and state I/O, the shared step builder, one file per algorithm
  "${_ts_root}/csrc/optim/hyperparams.cpp"
  "${_ts_root}/csrc/optim/options_io.cpp"
  "${_ts_root}/csrc/optim/fused_step_builder.cpp"
  "${_ts_root}/csrc/optim/adam.cpp"
  "${_ts_root}/csrc/optim/sgd.cpp"
  "${_ts_root}/csrc/optim/lion.cpp"
  "${_ts_root}/csrc/optim/lamb.cpp"
  "${_ts_root}/csrc/optim/lr_scheduler.cpp"
)
set(TORCHSPEED_OPTIM_CUDA_SOURCES
  "${_ts_root}/csrc/kernels/cuda/optim.cu"
  "${_ts_root}/csrc/kernels/cuda/optim_lowbit.cu"
  "${_ts_root}/csrc/kernels/cuda/grad_stats.cu"
  "${_ts_root}/csrc/kernels/cuda/mask.cu"
  "${_ts_root}/csrc/kernels/cuda/lowbit.cu"
  "${_ts_root}/csrc/ops/cuda/optim_cuda.cpp"
  "${_ts_root}/csrc/ops/cuda/grad_stats_cuda.cpp"
  "${_ts_root}/csrc/ops/cuda/mask_cuda.cpp"
)
set(TORCHSPEED_OPTIM_PYTHON_SOURCES "${_ts_root}/csrc/python/optim_bindings.cpp")
set(TORCHSPEED_OPTIM_TEST_SOURCES
  "${_ts_root}/tests/cpp/optim/test_ops_args.cpp"
  "${_ts_root}/tests/cpp/optim/test_ops_grad_stats.cpp"
  "${_ts_root}/tests/cpp/optim/test_optim_cpp_api.cpp"
  "${_ts_root}/tests/cpp/optim/test_optim_cpp_lowbit.cpp"
  "${_ts_root}/tests/cpp/optim/test_optim_cpp_lowbit_one_moment.cpp"
  "${_ts_root}/tests/cpp/optim/test_optim_cpp_parity.cpp"
  "${_ts_root}/tests/cpp/optim/test_optim_lr_scheduler.cpp"
)
set(TORCHSPEED_OPTIM_FEATURES optim)
torchspeed_area(optim)
unset(_ts_root)
