# The profile area (torchspeed.profile, include/torchspeed/profile/): the one clock, the per-thread
# event rings, ranges, the step breakdown, the Chrome trace writer, and NVTX in CUDA builds.
# Always built: every other area times itself with its clock. Included by CMakeLists.txt like every
# cmake/<area>.cmake: sets TORCHSPEED_PROFILE_* and registers with torchspeed_area().
set(_ts_root "${CMAKE_CURRENT_LIST_DIR}/..")
# Torch-free: csrc/profile/*.cpp include no torch header. Its tests (tests/cpp/CMakeLists.txt:
# test_profile, and profile_range_loop for callgrind) compile these sources without torch, which
# checks that too; so the area has no torch-linked TEST_SOURCES.
file(GLOB TORCHSPEED_PROFILE_CORE_SOURCES CONFIGURE_DEPENDS "${_ts_root}/csrc/profile/*.cpp")
set(TORCHSPEED_PROFILE_SOURCES ${TORCHSPEED_PROFILE_CORE_SOURCES})
set(TORCHSPEED_PROFILE_PYTHON_SOURCES "${_ts_root}/csrc/python/profile_bindings.cpp")
set(TORCHSPEED_PROFILE_FEATURES profile)
set(TORCHSPEED_PROFILE_INCLUDE_DIRS "")
if(TORCHSPEED_CUDA_ENABLED)
  # csrc/profile/nvtx.cpp mirrors ranges to NVTX: the header-only nvtx3 of the CUDA toolkit.
  find_package(CUDAToolkit REQUIRED)
  list(APPEND TORCHSPEED_PROFILE_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS})
  list(APPEND TORCHSPEED_PROFILE_FEATURES nvtx)
endif()
torchspeed_area(profile)
unset(_ts_root)
