# Sourced by the build scripts (build.sh, sanitize.sh, check_areas_off.sh): when ccache is installed,
# sets CCACHE_LAUNCHER to the CMake arguments that compile through it and exports CCACHE_BASEDIR (the
# repository root), so that command lines are the same in every build folder of the same depth and
# in every clone: a rebuild, an area-OFF build and a second CI run reuse every unchanged object.
CCACHE_LAUNCHER=()
if command -v ccache >/dev/null 2>&1; then
  CCACHE_LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                   -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
fi
