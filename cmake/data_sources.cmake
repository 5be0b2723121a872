# Source lists, include dirs, libraries and definitions of torchspeed.data (issue 4), included by the
# top-level CMakeLists.txt. Sets variables only; it never creates or changes targets.
set(_ts_data_root "${CMAKE_CURRENT_LIST_DIR}/..")

# Torch-free core: tar/index, .npy, decode + transforms, sampling (tested without libtorch).
set(TORCHSPEED_DATA_CORE_SOURCES
  "${_ts_data_root}/csrc/data/image.cpp"
  "${_ts_data_root}/csrc/data/mapped_file.cpp"
  "${_ts_data_root}/csrc/data/npy.cpp"
  "${_ts_data_root}/csrc/data/sampling.cpp"
  "${_ts_data_root}/csrc/data/tar_reader.cpp"
)
# Torch-aware loader (threads, batch slots, sources) behind include/torchspeed/data/loader.h.
set(TORCHSPEED_DATA_SOURCES
  "${_ts_data_root}/csrc/data/loader.cpp"
  "${_ts_data_root}/csrc/data/sources.cpp"
)
set(TORCHSPEED_DATA_PYTHON_SOURCES "${_ts_data_root}/csrc/python/data_bindings.cpp")
set(TORCHSPEED_DATA_TEST_SOURCES
  "${_ts_data_root}/tests/cpp/data/test_image.cpp"
  "${_ts_data_root}/tests/cpp/data/test_loader.cpp"
  "${_ts_data_root}/tests/cpp/data/test_npy.cpp"
  "${_ts_data_root}/tests/cpp/data/test_tar.cpp"
)
set(TORCHSPEED_DATA_FUZZ_TARGETS
  "${_ts_data_root}/tests/fuzz/fuzz_decode.cpp"
  "${_ts_data_root}/tests/fuzz/fuzz_index.cpp"
  "${_ts_data_root}/tests/fuzz/fuzz_tar.cpp"
)
set(TORCHSPEED_DATA_INCLUDE_DIRS "${_ts_data_root}/csrc/data")
set(TORCHSPEED_DATA_LIBS "")
set(TORCHSPEED_DATA_DEFINITIONS "")

find_package(PkgConfig QUIET)

# libjpeg-turbo (TurboJPEG API). Without it JPEG samples fail at run time with a clear message.
set(_ts_jpeg_found OFF)
if(PkgConfig_FOUND)
  pkg_check_modules(TORCHSPEED_TURBOJPEG QUIET libturbojpeg)
  if(TORCHSPEED_TURBOJPEG_FOUND)
    # Plain paths, not imported targets, so install(EXPORT) of libtorchspeed stays self-contained.
    list(APPEND TORCHSPEED_DATA_INCLUDE_DIRS ${TORCHSPEED_TURBOJPEG_INCLUDE_DIRS})
    list(APPEND TORCHSPEED_DATA_LIBS ${TORCHSPEED_TURBOJPEG_LINK_LIBRARIES})
    set(_ts_jpeg_found ON)
  endif()
endif()
if(NOT _ts_jpeg_found)
  find_path(TORCHSPEED_TURBOJPEG_INCLUDE_DIR turbojpeg.h)
  find_library(TORCHSPEED_TURBOJPEG_LIBRARY NAMES turbojpeg)
  if(TORCHSPEED_TURBOJPEG_INCLUDE_DIR AND TORCHSPEED_TURBOJPEG_LIBRARY)
    list(APPEND TORCHSPEED_DATA_INCLUDE_DIRS "${TORCHSPEED_TURBOJPEG_INCLUDE_DIR}")
    list(APPEND TORCHSPEED_DATA_LIBS "${TORCHSPEED_TURBOJPEG_LIBRARY}")
    set(_ts_jpeg_found ON)
  endif()
endif()
if(_ts_jpeg_found)
  set(TORCHSPEED_WITH_JPEG ON)
  list(APPEND TORCHSPEED_DATA_DEFINITIONS TORCHSPEED_WITH_JPEG=1)
  # The libjpeg API of the same libjpeg-turbo (optional): region decode for random crops.
  if(PkgConfig_FOUND)
    pkg_check_modules(TORCHSPEED_LIBJPEG QUIET libjpeg)
  endif()
  if(TORCHSPEED_LIBJPEG_FOUND)
    list(APPEND TORCHSPEED_DATA_INCLUDE_DIRS ${TORCHSPEED_LIBJPEG_INCLUDE_DIRS})
    list(APPEND TORCHSPEED_DATA_LIBS ${TORCHSPEED_LIBJPEG_LINK_LIBRARIES})
    list(APPEND TORCHSPEED_DATA_DEFINITIONS TORCHSPEED_WITH_LIBJPEG=1)
  endif()
else()
  set(TORCHSPEED_WITH_JPEG OFF)
  list(APPEND TORCHSPEED_DATA_DEFINITIONS TORCHSPEED_WITH_JPEG=0)
  message(WARNING "torchspeed.data: libjpeg-turbo (libturbojpeg) not found; JPEG decode disabled")
endif()

# libpng (required: PNG decode).
find_package(PNG REQUIRED)
list(APPEND TORCHSPEED_DATA_INCLUDE_DIRS ${PNG_INCLUDE_DIRS})
list(APPEND TORCHSPEED_DATA_LIBS ${PNG_LIBRARIES})
list(APPEND TORCHSPEED_DATA_DEFINITIONS ${PNG_DEFINITIONS})

unset(_ts_jpeg_found)
unset(_ts_data_root)
