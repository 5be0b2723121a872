# Helper functions for the top-level CMakeLists.txt: finding torch and Python, deciding CUDA,
# per-target flags, areas, per-ISA kernel units, build_info.json. Nothing here changes global or
# directory-wide flags, so torchspeed can be embedded with add_subdirectory.

# Finds Torch (through Python's torch when CMAKE_PREFIX_PATH does not already reach it) and,
# optionally, the Python pieces the _C module needs.
macro(torchspeed_find_python_and_torch)
  set(_want_python "${TORCHSPEED_BUILD_PYTHON}")
  if(NOT _want_python STREQUAL "OFF")
    if(_want_python STREQUAL "ON")
      find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)
    else()
      find_package(Python3 COMPONENTS Interpreter Development.Module)
    endif()
  endif()
  set(TORCHSPEED_TORCH_PY_OK FALSE)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c "import torch, os, sysconfig; print(torch.utils.cmake_prefix_path); print(os.path.join(os.path.dirname(torch.__file__), 'lib')); print(sysconfig.get_config_var('EXT_SUFFIX')); print(';'.join('%s=\"%s\"' % (n, getattr(torch._C, '_' + n)) for n in ('PYBIND11_COMPILER_TYPE', 'PYBIND11_STDLIB', 'PYBIND11_BUILD_ABI') if getattr(torch._C, '_' + n, None)))"
      OUTPUT_VARIABLE _torch_py OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _torch_py_rc ERROR_QUIET)
    if(_torch_py_rc EQUAL 0)
      string(REPLACE "\n" ";" _torch_py "${_torch_py}")
      list(GET _torch_py 0 _torch_cmake_prefix)
      list(GET _torch_py 1 _torch_lib_dir)
      list(GET _torch_py 2 TORCHSPEED_PYTHON_MODULE_SUFFIX)
      list(LENGTH _torch_py _n)
      set(TORCHSPEED_PYBIND11_ABI_DEFINITIONS "")
      if(_n GREATER 3)
        list(GET _torch_py 3 _abi)
        string(REPLACE "\"" "\\\"" _abi "${_abi}")
        set(TORCHSPEED_PYBIND11_ABI_DEFINITIONS "${_abi}")
      endif()
      list(APPEND CMAKE_PREFIX_PATH "${_torch_cmake_prefix}")
      set(TORCHSPEED_TORCH_PY_OK TRUE)
    endif()
  endif()
  find_package(Torch REQUIRED)
  # Embedded (add_subdirectory) in a project that did not find Torch itself: torch's imported
  # targets, and those of its dependencies, were created in this directory; make them visible to
  # the parent, whose targets link torchspeed::torchspeed and so torch.
  if(NOT PROJECT_IS_TOP_LEVEL)
    get_directory_property(_ts_imported IMPORTED_TARGETS)
    foreach(_t IN LISTS _ts_imported)
      get_target_property(_global ${_t} IMPORTED_GLOBAL)
      if(NOT _global)
        set_property(TARGET ${_t} PROPERTY IMPORTED_GLOBAL TRUE)
      endif()
    endforeach()
  endif()
  if(DEFINED Torch_VERSION)
    set(TORCHSPEED_TORCH_VERSION "${Torch_VERSION}")
  else()
    set(TORCHSPEED_TORCH_VERSION "unknown")
  endif()
  if(TORCHSPEED_TORCH_PY_OK)
    # The exact torch.__version__ (with its +cpu / +cu130 tag): the import-time check compares it.
    execute_process(COMMAND "${Python3_EXECUTABLE}" -c "import torch; print(torch.__version__)"
      OUTPUT_VARIABLE TORCHSPEED_TORCH_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
  # torch's compile flags carry -D_GLIBCXX_USE_CXX11_ABI=0|1: every target must agree with it,
  # also the torch-free ones (torchspeed_target_defaults adds them per target).
  separate_arguments(TORCHSPEED_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")

  set(TORCHSPEED_PYTHON_ENABLED OFF)
  if(NOT TORCHSPEED_BUILD_PYTHON STREQUAL "OFF" AND TORCHSPEED_TORCH_PY_OK AND Python3_Development.Module_FOUND)
    find_library(TORCHSPEED_TORCH_PYTHON_LIBRARY torch_python PATHS "${_torch_lib_dir}" NO_DEFAULT_PATH)
    if(TORCHSPEED_TORCH_PYTHON_LIBRARY)
      set(TORCHSPEED_PYTHON_ENABLED ON)
    endif()
  endif()
  if(TORCHSPEED_BUILD_PYTHON STREQUAL "ON" AND NOT TORCHSPEED_PYTHON_ENABLED)
    message(FATAL_ERROR "torchspeed: TORCHSPEED_BUILD_PYTHON=ON but Python 3 headers, torch or libtorch_python were not found")
  endif()
endmacro()

# AUTO: CUDA only when nvcc is found AND the torch we build against has CUDA. Never decided by
# whether a GPU is visible.
macro(torchspeed_resolve_cuda)
  set(TORCHSPEED_CUDA_ENABLED OFF)
  set(_torch_has_cuda FALSE)
  if(TARGET torch_cuda OR CAFFE2_USE_CUDA)
    set(_torch_has_cuda TRUE)
  endif()
  if(TORCHSPEED_WITH_CUDA STREQUAL "ON" OR TORCHSPEED_WITH_CUDA STREQUAL "AUTO")
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER AND _torch_has_cuda)
      set(TORCHSPEED_CUDA_ENABLED ON)
    elseif(TORCHSPEED_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "torchspeed: TORCHSPEED_WITH_CUDA=ON but "
        "nvcc found: '${CMAKE_CUDA_COMPILER}', torch has CUDA: ${_torch_has_cuda}")
    else()
      message(STATUS "torchspeed: CUDA off (nvcc: '${CMAKE_CUDA_COMPILER}', torch has CUDA: ${_torch_has_cuda})")
    endif()
  endif()
  if(TORCHSPEED_CUDA_ENABLED)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_ARCHITECTURES "${TORCHSPEED_CUDA_ARCHITECTURES}")
    enable_language(CUDA)
  endif()
endmacro()

# What every torchspeed target gets, on the target (never globally): C++17, warnings, torch's ABI
# flags, and the TORCHSPEED_SANITIZE instrumentation.
function(torchspeed_target_defaults target)
  target_compile_features(${target} PRIVATE cxx_std_17)
  set(_cxx ${TORCHSPEED_WARNINGS} ${TORCHSPEED_TORCH_CXX_FLAGS})
  if(TORCHSPEED_SANITIZE)
    list(APPEND _cxx -fsanitize=${TORCHSPEED_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  endif()
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${_cxx}>")
  if(TORCHSPEED_SANITIZE)
    get_target_property(_type ${target} TYPE)
    if(NOT _type STREQUAL "STATIC_LIBRARY")
      target_link_options(${target} PRIVATE -fsanitize=${TORCHSPEED_SANITIZE})
    endif()
  endif()
endfunction()

# Reads cmake/areas.txt, the one list of areas and build switches (format in that file), and
# declares option(TORCHSPEED_WITH_<SWITCH>) for each switch. Sets TORCHSPEED_AREA_NAMES (every area,
# in include order), TORCHSPEED_SWITCHES (every switch), TORCHSPEED_SWITCH_<SWITCH>_AREA (its
# area) and TORCHSPEED_AREA_<area>_SWITCH (an optional area's own switch, its first one).
macro(torchspeed_declare_areas file)
  set(TORCHSPEED_AREA_NAMES "")
  set(TORCHSPEED_SWITCHES "")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${file}")
  file(STRINGS "${file}" _ts_area_lines REGEX "^[a-z]")
  foreach(_ts_line IN LISTS _ts_area_lines)
    if(NOT _ts_line MATCHES "^([a-z_]+)[ ]+([A-Z0-9_]+|-)[ ]+(.+)$")
      message(FATAL_ERROR "torchspeed: ${file}: bad line '${_ts_line}' (want: <area> <SWITCH or -> <description>)")
    endif()
    set(_ts_a "${CMAKE_MATCH_1}")
    set(_ts_s "${CMAKE_MATCH_2}")
    set(_ts_d "${CMAKE_MATCH_3}")
    if(NOT _ts_a IN_LIST TORCHSPEED_AREA_NAMES)
      list(APPEND TORCHSPEED_AREA_NAMES ${_ts_a})
    endif()
    if(NOT _ts_s STREQUAL "-")
      option(TORCHSPEED_WITH_${_ts_s} "${_ts_d}" ON)
      list(APPEND TORCHSPEED_SWITCHES ${_ts_s})
      set(TORCHSPEED_SWITCH_${_ts_s}_AREA ${_ts_a})
      if(NOT DEFINED TORCHSPEED_AREA_${_ts_a}_SWITCH)
        set(TORCHSPEED_AREA_${_ts_a}_SWITCH ${_ts_s})
      endif()
    endif()
  endforeach()
  unset(_ts_area_lines)
  unset(_ts_line)
  unset(_ts_a)
  unset(_ts_s)
  unset(_ts_d)
endmacro()

# Sets TORCHSPEED_<SWITCH>_BUILT to ON or OFF for every switch, as it took effect: the option is
# on and its area was built (so JPEG is OFF whenever DATA is).
macro(torchspeed_resolve_switches)
  foreach(_ts_s IN LISTS TORCHSPEED_SWITCHES)
    if(TORCHSPEED_WITH_${_ts_s} AND TORCHSPEED_SWITCH_${_ts_s}_AREA IN_LIST TORCHSPEED_AREAS)
      set(TORCHSPEED_${_ts_s}_BUILT ON)
    else()
      set(TORCHSPEED_${_ts_s}_BUILT OFF)
    endif()
  endforeach()
  unset(_ts_s)
endmacro()

# Registers an area. cmake/<area>.cmake sets TORCHSPEED_<AREA>_SOURCES (libtorchspeed),
# _CUDA_SOURCES, _PYTHON_SOURCES (torchspeed._C), _TEST_SOURCES (the test_<area> executable),
# _INCLUDE_DIRS, _LIBS, _DEFINITIONS and _FEATURES (build_info.json, torchspeedConfig.cmake), then
# calls torchspeed_area(<area>); this appends them to the TORCHSPEED_AREA_* lists the targets use.
function(torchspeed_area name)
  string(TOUPPER "${name}" _n)
  foreach(_kind SOURCES CUDA_SOURCES PYTHON_SOURCES INCLUDE_DIRS LIBS DEFINITIONS FEATURES)
    set(TORCHSPEED_AREA_${_kind} ${TORCHSPEED_AREA_${_kind}} ${TORCHSPEED_${_n}_${_kind}} PARENT_SCOPE)
  endforeach()
  # The area's definitions and include folders go on its own sources only: every other file
  # compiles with the same flags whichever areas are built, so ccache reuses its objects across
  # the area-OFF builds (scripts/check_areas_off.sh).
  set(_own ${TORCHSPEED_${_n}_SOURCES} ${TORCHSPEED_${_n}_CUDA_SOURCES} ${TORCHSPEED_${_n}_PYTHON_SOURCES})
  if(_own AND TORCHSPEED_${_n}_DEFINITIONS)
    set_property(SOURCE ${_own} APPEND PROPERTY COMPILE_DEFINITIONS ${TORCHSPEED_${_n}_DEFINITIONS})
  endif()
  if(_own AND TORCHSPEED_${_n}_INCLUDE_DIRS)
    set_property(SOURCE ${_own} APPEND PROPERTY INCLUDE_DIRECTORIES ${TORCHSPEED_${_n}_INCLUDE_DIRS})
  endif()
  set(TORCHSPEED_AREAS ${TORCHSPEED_AREAS} ${name} PARENT_SCOPE)
endfunction()

# Adds csrc/kernels/cpu/isa_<name>.cpp to torchspeed_cpu_kernels with its own flags, when the
# target is x86-64 and the compiler accepts them.
function(torchspeed_add_isa_unit name flags define)
  include(CheckCXXCompilerFlag)
  if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
    return()
  endif()
  string(REPLACE ";" " " _flags_str "${flags}")
  check_cxx_compiler_flag("${_flags_str}" TORCHSPEED_COMPILER_HAS_${name})
  if(NOT TORCHSPEED_COMPILER_HAS_${name})
    return()
  endif()
  set(_src csrc/kernels/cpu/isa_${name}.cpp)
  target_sources(torchspeed_cpu_kernels PRIVATE ${_src})
  set_source_files_properties(${_src} PROPERTIES
    COMPILE_OPTIONS "${flags}" COMPILE_DEFINITIONS TORCHSPEED_CPU_ISA_NAMESPACE=isa_${name})
  target_compile_definitions(torchspeed_cpu_kernels PRIVATE ${define})
  set(TORCHSPEED_CPU_ISAS ${TORCHSPEED_CPU_ISAS} ${name} PARENT_SCOPE)
endfunction()

function(torchspeed_write_build_info path)
  set(_cuda_archs "[]")
  if(TORCHSPEED_CUDA_ENABLED)
    string(REPLACE ";" "\", \"" _a "${TORCHSPEED_CUDA_ARCHITECTURES}")
    set(_cuda_archs "[\"${_a}\"]")
  endif()
  string(REPLACE ";" "\", \"" _isas "${TORCHSPEED_CPU_ISAS}")
  set(_features "[]")
  if(TORCHSPEED_FEATURES)
    string(REPLACE ";" "\", \"" _f "${TORCHSPEED_FEATURES}")
    set(_features "[\"${_f}\"]")
  endif()
  if(TORCHSPEED_CUDA_ENABLED)
    set(_cuda true)
  else()
    set(_cuda false)
  endif()
  # The switches as they took effect (torchspeed_resolve_switches), every one of cmake/areas.txt.
  set(_options "")
  foreach(_s IN LISTS TORCHSPEED_SWITCHES)
    if(_options)
      string(APPEND _options ", ")
    endif()
    string(APPEND _options "\"TORCHSPEED_WITH_${_s}\": \"${TORCHSPEED_${_s}_BUILT}\"")
  endforeach()
  file(WRITE "${path}" "{
  \"version\": \"${PROJECT_VERSION}\",
  \"torch_version\": \"${TORCHSPEED_TORCH_VERSION}\",
  \"cuda\": ${_cuda},
  \"cuda_compiler_version\": \"${CMAKE_CUDA_COMPILER_VERSION}\",
  \"cuda_architectures\": ${_cuda_archs},
  \"cpu_isas\": [\"${_isas}\"],
  \"features\": ${_features},
  \"options\": {${_options}},
  \"cxx_compiler\": \"${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}\",
  \"build_type\": \"${CMAKE_BUILD_TYPE}\",
  \"sanitize\": \"${TORCHSPEED_SANITIZE}\"
}
")
endfunction()

# Sets `out` to an install RUNPATH: the `leading` entries ($ORIGIN-relative ones), then the absolute
# folder of torch's libraries and of every library in ARGN that is not in a system folder (the
# loader searches those anyway). Explicit, unlike INSTALL_RPATH_USE_LINK_PATH, which would also
# copy the stray link folders torch's CMake config declares (e.g. MKL's /lib/intel64).
function(torchspeed_install_rpath out leading)
  set(_dirs ${leading})
  set(_system ${CMAKE_PLATFORM_IMPLICIT_LINK_DIRECTORIES} ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES})
  foreach(_lib IN LISTS TORCH_LIBRARY ARGN)
    if(IS_ABSOLUTE "${_lib}" AND EXISTS "${_lib}")
      get_filename_component(_dir "${_lib}" DIRECTORY)
      if(NOT _dir IN_LIST _system)
        list(APPEND _dirs "${_dir}")
      endif()
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _dirs)
  set(${out} "${_dirs}" PARENT_SCOPE)
endfunction()
