# The data area (torchspeed.data, include/torchspeed/data/): the loader, WebDataset shards, .npy,
# JPEG/PNG decode. Included by CMakeLists.txt when TORCHSPEED_WITH_DATA is on (its switches, DATA
# and JPEG, are in cmake/areas.txt): sets TORCHSPEED_DATA_* and registers with torchspeed_area().
# It creates no targets.
set(_ts_data_root "${CMAKE_CURRENT_LIST_DIR}/..")

# Torch-free core: tar/index, .npy, decode + transforms, sampling (tested without libtorch).
set(TORCHSPEED_DATA_CORE_SOURCES
  "${_ts_data_root}/csrc/data/image_decode.cpp"
  "${_ts_data_root}/csrc/data/image_resample.cpp"
  "${_ts_data_root}/csrc/data/image_transform.cpp"
  "${_ts_data_root}/csrc/data/mapped_file.cpp"
  "${_ts_data_root}/csrc/data/npy.cpp"
  "${_ts_data_root}/csrc/data/sampling.cpp"
  "${_ts_data_root}/csrc/data/tar_reader.cpp"
)
# Torch-aware loader (threads, batch slots, sources) behind include/torchspeed/data/loader.h.
set(TORCHSPEED_DATA_SOURCES
  "${_ts_data_root}/csrc/data/loader.cpp"
  "${_ts_data_root}/csrc/data/loader_device.cpp"
  "${_ts_data_root}/csrc/data/loader_errors.cpp"
  "${_ts_data_root}/csrc/data/loader_schedule.cpp"
  "${_ts_data_root}/csrc/data/loader_workers.cpp"
  "${_ts_data_root}/csrc/data/sources.cpp"
)
set(TORCHSPEED_DATA_PYTHON_SOURCES "${_ts_data_root}/csrc/python/data_bindings.cpp")
set(TORCHSPEED_DATA_TEST_SOURCES
  "${_ts_data_root}/tests/cpp/data/test_image.cpp"
  "${_ts_data_root}/tests/cpp/data/test_loader.cpp"
  "${_ts_data_root}/tests/cpp/data/test_npy.cpp"
  "${_ts_data_root}/tests/cpp/data/test_tar.cpp"
)
set(TORCHSPEED_DATA_INCLUDE_DIRS "")  # its headers are included from csrc/ ("data/image.h")
set(TORCHSPEED_DATA_LIBS "")
set(TORCHSPEED_DATA_DEFINITIONS "")

find_package(PkgConfig QUIET)

# JPEG and PNG are part of the default build: a missing library stops configure with what to
# install and which option leaves the format out, instead of building a loader that fails at its
# first batch. TORCHSPEED_TURBOJPEG_* / TORCHSPEED_LIBJPEG_* (cache) point at a custom install.
set(_ts_debian_hint "On Debian/Ubuntu: apt-get install libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev")

# Finds header `header` and library `lib` of the pkg-config module `module` into the cache
# variables <var>_INCLUDE_DIR and <var>_LIBRARY (pkg-config's folders as hints); sets <var>_OK.
macro(_ts_find_image_library var module header lib)
  if(PkgConfig_FOUND)
    pkg_check_modules(_ts_pc_${var} QUIET ${module})
  endif()
  find_path(${var}_INCLUDE_DIR ${header} HINTS ${_ts_pc_${var}_INCLUDE_DIRS})
  find_library(${var}_LIBRARY NAMES ${lib} HINTS ${_ts_pc_${var}_LIBRARY_DIRS})
  # A user-set path is kept by find_path/find_library as it is: check that it holds the header.
  if(${var}_INCLUDE_DIR AND EXISTS "${${var}_INCLUDE_DIR}/${header}" AND ${var}_LIBRARY
     AND EXISTS "${${var}_LIBRARY}")
    set(${var}_OK ON)
  else()
    set(${var}_OK OFF)
  endif()
endmacro()

if(TORCHSPEED_WITH_JPEG)
  # libjpeg-turbo: the TurboJPEG API (decode, decode-time scaling) and the libjpeg API of the same
  # library (region decode for random crops). Plain paths, not imported targets, so
  # install(EXPORT) of libtorchspeed stays self-contained.
  _ts_find_image_library(TORCHSPEED_TURBOJPEG libturbojpeg turbojpeg.h turbojpeg)
  _ts_find_image_library(TORCHSPEED_LIBJPEG libjpeg jpeglib.h jpeg)
  set(_ts_missing "")
  if(NOT TORCHSPEED_TURBOJPEG_OK)
    string(APPEND _ts_missing "\n  TurboJPEG API (turbojpeg.h, libturbojpeg; Debian package libturbojpeg0-dev): "
      "include dir '${TORCHSPEED_TURBOJPEG_INCLUDE_DIR}', library '${TORCHSPEED_TURBOJPEG_LIBRARY}'")
  endif()
  if(NOT TORCHSPEED_LIBJPEG_OK)
    string(APPEND _ts_missing "\n  libjpeg API (jpeglib.h, libjpeg; Debian package libjpeg62-turbo-dev): "
      "include dir '${TORCHSPEED_LIBJPEG_INCLUDE_DIR}', library '${TORCHSPEED_LIBJPEG_LIBRARY}'")
  endif()
  if(_ts_missing)
    message(FATAL_ERROR "torchspeed.data: JPEG decode needs libjpeg-turbo's development files; "
      "not found:${_ts_missing}\n"
      "${_ts_debian_hint}\n"
      "Or build without JPEG decode: -DTORCHSPEED_WITH_JPEG=OFF "
      "(pip: TORCHSPEED_WITH_JPEG=OFF pip install ...); JPEG samples then fail with an error naming "
      "that option.\n"
      "For a libjpeg-turbo in another prefix, add the prefix to CMAKE_PREFIX_PATH or set "
      "TORCHSPEED_TURBOJPEG_INCLUDE_DIR / TORCHSPEED_TURBOJPEG_LIBRARY (and TORCHSPEED_LIBJPEG_*).")
  endif()
  list(APPEND TORCHSPEED_DATA_INCLUDE_DIRS "${TORCHSPEED_TURBOJPEG_INCLUDE_DIR}" "${TORCHSPEED_LIBJPEG_INCLUDE_DIR}")
  list(APPEND TORCHSPEED_DATA_LIBS "${TORCHSPEED_TURBOJPEG_LIBRARY}" "${TORCHSPEED_LIBJPEG_LIBRARY}")
  list(APPEND TORCHSPEED_DATA_DEFINITIONS TORCHSPEED_WITH_JPEG=1 TORCHSPEED_WITH_LIBJPEG=1)
else()
  list(APPEND TORCHSPEED_DATA_DEFINITIONS TORCHSPEED_WITH_JPEG=0)
  message(STATUS "torchspeed.data: JPEG decode off (TORCHSPEED_WITH_JPEG=OFF)")
endif()

# libpng: PNG decode, which the data area always has (TORCHSPEED_WITH_DATA=OFF leaves it all out).
find_package(PNG)
if(NOT PNG_FOUND)
  message(FATAL_ERROR "torchspeed.data: PNG decode needs libpng's development files (png.h, "
    "libpng and zlib); not found.\n"
    "${_ts_debian_hint}\n"
    "Or build without the data loader: -DTORCHSPEED_WITH_DATA=OFF "
    "(pip: TORCHSPEED_WITH_DATA=OFF pip install ...).\n"
    "For a libpng in another prefix, add it to CMAKE_PREFIX_PATH or set PNG_PNG_INCLUDE_DIR / PNG_LIBRARY.")
endif()
list(APPEND TORCHSPEED_DATA_INCLUDE_DIRS ${PNG_INCLUDE_DIRS})
list(APPEND TORCHSPEED_DATA_LIBS ${PNG_LIBRARIES})
list(APPEND TORCHSPEED_DATA_DEFINITIONS ${PNG_DEFINITIONS})

set(TORCHSPEED_DATA_FEATURES data png)
if(TORCHSPEED_WITH_JPEG)
  list(APPEND TORCHSPEED_DATA_FEATURES jpeg jpeg-region-decode)
endif()
list(APPEND TORCHSPEED_DATA_SOURCES ${TORCHSPEED_DATA_CORE_SOURCES})
torchspeed_area(data)

unset(_ts_missing)
unset(_ts_debian_hint)
unset(_ts_data_root)
