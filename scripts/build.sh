#!/usr/bin/env bash
# Builds and installs torchspeed into the current Python (pip, against the installed torch), with
# the C++ tests, in build/release (reused between runs, so a rebuild is incremental; ccache
# when installed).
# TORCHSPEED_EDITABLE=1 makes it an editable (development) install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export TORCHSPEED_BUILD_DIR=${TORCHSPEED_BUILD_DIR:-$PWD/build/release}
export CMAKE_ARGS="-DTORCHSPEED_BUILD_TESTS=ON ${CMAKE_ARGS:-}"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
# ccache when installed (scripts/ccache.sh): a rebuild reuses every unchanged object.
source scripts/ccache.sh
CMAKE_ARGS="${CCACHE_LAUNCHER[*]} $CMAKE_ARGS"
mkdir -p build
log=build/pip-install.log
if ! "$PY" -m pip install --no-build-isolation --no-deps ${TORCHSPEED_EDITABLE:+-e} . >"$log" 2>&1; then
  grep -v "Running pip as the 'root' user" "$log" | tail -60
  echo "build.sh: pip install failed (full log: $log)"
  exit 1
fi
(cd /tmp && "$PY" -c "import torchspeed, sys; print('built torchspeed', torchspeed.__version__, 'at', torchspeed.__file__)")
