#!/usr/bin/env bash
# Builds torchspeed once per optional area of cmake/areas.txt (DATA, DIST, QUANT, PRUNE) with that
# area OFF, installs each build into a throwaway copy of the package (build/off-<area>/site) and runs
# tests/build_config/area_off_smoke.py on it: every module imports, the other areas work against a
# torch reference, and the missing area raises AreaNotBuiltError naming its option.
#
#   scripts/check_areas_off.sh              # every optional area
#   AREAS_OFF="QUANT PRUNE" scripts/check_areas_off.sh
#
# Cheap with ccache (scripts/build.sh and this script use it when it is installed): an area's
# definitions go on its own sources only, so apart from csrc/python/module.cpp every object of an
# OFF build is one the full build already compiled. The build folders sit at the depth of
# build/release so that CCACHE_BASEDIR makes their command lines identical.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
TORCH_CMAKE=$("$PY" -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
source scripts/ccache.sh
launcher=("${CCACHE_LAUNCHER[@]}")
[ ${#launcher[@]} -gt 0 ] || echo "check_areas_off: no ccache: every configuration compiles from scratch"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# Each optional area's own switch: the first switch on its lines of cmake/areas.txt.
switches=${AREAS_OFF:-$(awk '!/^#/ && NF > 2 && $2 != "-" && !seen[$1]++ { print $2 }' cmake/areas.txt)}

failures=0
for switch in $switches; do
  area=$(echo "$switch" | tr 'A-Z' 'a-z')
  b=build/off-$area
  log=$ROOT/$b.log
  t0=$SECONDS
  mkdir -p "$b"
  if cmake -S . -B "$b" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTORCHSPEED_WITH_"$switch"=OFF \
       -DCMAKE_PREFIX_PATH="$TORCH_CMAKE" -DPython3_EXECUTABLE="$(command -v "$PY")" \
       -DTORCHSPEED_BUILD_PYTHON=ON -DTORCHSPEED_WITH_CUDA="${TORCHSPEED_WITH_CUDA:-AUTO}" \
       -DCMAKE_INSTALL_PREFIX="$ROOT/$b/site/torchspeed" -DCMAKE_INSTALL_LIBDIR=lib \
       -DTORCHSPEED_PYTHON_INSTALL_DIR=. "${launcher[@]}" >"$log" 2>&1 &&
     cmake --build "$b" -j "${MAX_JOBS:-$(nproc)}" >>"$log" 2>&1 &&
     rm -rf "$b/site" && mkdir -p "$b/site" && cp -r python/torchspeed "$b/site/" &&
     rm -rf "$b/site/torchspeed/"{lib,include,share,build_info.json} "$b/site/torchspeed/"_C*.so &&
     cmake --install "$b" >>"$log" 2>&1 &&
     (cd /tmp && PYTHONPATH="$ROOT/$b/site" "$PY" "$ROOT/tests/build_config/area_off_smoke.py" "$switch") >>"$log" 2>&1
  then
    echo "PASS  TORCHSPEED_WITH_$switch=OFF ($((SECONDS - t0)) s): $(tail -1 "$log")"
  else
    echo "FAIL  TORCHSPEED_WITH_$switch=OFF ($((SECONDS - t0)) s), log $log:"
    tail -30 "$log"
    failures=$((failures + 1))
  fi
done
[ "$failures" -eq 0 ] || { echo "check_areas_off: $failures failure(s)"; exit 1; }
echo "check_areas_off: all passed"
