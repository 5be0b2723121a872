#!/usr/bin/env bash
# Same-run A/B of the image resampler (and the whole per-image pipeline) between an older revision
# and the working tree: both are compiled as the release build compiles them (-O3; the kernel
# layer's ISA units with their own -m flags) into one program that times them interleaved on the
# same inputs. Usage: bench/ab_resampler.sh [OLD_REV] (default 71ae949: the last revision whose
# resampler used target_clones outside the kernel table).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OLD_REV=${1:-71ae949}
CXX=${CXX:-g++}
OUT="$(mktemp -d)"
trap 'git -C "$ROOT" worktree remove --force "$OUT/old" >/dev/null 2>&1 || true; rm -rf "$OUT"' EXIT
git -C "$ROOT" worktree add --detach "$OUT/old" "$OLD_REV" >/dev/null 2>&1
LIBS="$(pkg-config --libs libturbojpeg libpng 2>/dev/null || echo -lturbojpeg -lpng) -ljpeg"
DEFS="-DTORCHSPEED_WITH_JPEG=1 -DTORCHSPEED_WITH_LIBJPEG=1"
FLAGS="-std=c++17 -O3 -DNDEBUG $DEFS"
objs=()
side() {  # name tree image-header sources...
  local name=$1 tree=$2 header=$3
  shift 3
  local ns="-Dtorchspeed=$name"
  for src in "$@"; do
    "$CXX" $FLAGS $ns -I"$tree/include" -I"$tree/csrc" -I"$tree/csrc/data" -c "$src" \
      -o "$OUT/${name}_$(basename "$src" .cpp).o"
    objs+=("$OUT/${name}_$(basename "$src" .cpp).o")
  done
  "$CXX" $FLAGS $ns -DAB_SIDE="$name" -DAB_IMAGE_HEADER="\"$header\"" -I"$tree/include" \
    -I"$tree/csrc" -I"$tree/csrc/data" -c "$ROOT/bench/ab/adapter.cpp" -o "$OUT/${name}_adapter.o"
  objs+=("$OUT/${name}_adapter.o")
}
kernels() {  # name tree: the CPU kernel layer of `tree`, as CMake builds it
  local name=$1 tree=$2 ns="-Dtorchspeed=$1"
  local k="-std=c++17 -O3 -DNDEBUG -ffp-contract=off $ns -I$tree/csrc"
  "$CXX" $k -DTORCHSPEED_CPU_ISA_NAMESPACE=isa_scalar -c "$tree/csrc/kernels/cpu/isa_scalar.cpp" -o "$OUT/${name}_k0.o"
  "$CXX" $k -mavx2 -mfma -mf16c -DTORCHSPEED_CPU_ISA_NAMESPACE=isa_avx2 -c "$tree/csrc/kernels/cpu/isa_avx2.cpp" -o "$OUT/${name}_k1.o"
  "$CXX" $k -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -DTORCHSPEED_CPU_ISA_NAMESPACE=isa_avx512 \
    -c "$tree/csrc/kernels/cpu/isa_avx512.cpp" -o "$OUT/${name}_k2.o"
  "$CXX" $k -DTORCHSPEED_HAVE_AVX2_UNIT -DTORCHSPEED_HAVE_AVX512_UNIT -c "$tree/csrc/kernels/cpu/dispatch.cpp" -o "$OUT/${name}_k3.o"
  objs+=("$OUT/${name}_k0.o" "$OUT/${name}_k1.o" "$OUT/${name}_k2.o" "$OUT/${name}_k3.o")
}
side ab_old "$OUT/old" image.h "$OUT/old/csrc/data/image.cpp"
kernels ab_old "$OUT/old"
side ab_new "$ROOT" data/image.h "$ROOT"/csrc/data/image_{decode,resample,transform}.cpp
kernels ab_new "$ROOT"
"$CXX" -std=c++17 -O2 "$ROOT/bench/ab/main.cpp" "${objs[@]}" -o "$OUT/ab" $LIBS
python3 - "$OUT" <<'PY'
import sys
from PIL import Image
import numpy as np
rng = np.random.default_rng(0)
y, x = np.mgrid[0:375, 0:500]
photo = np.stack([(x * 0.5) % 256, (y * 0.7) % 256, ((x + y) * 0.3) % 256], -1)
photo = (photo + rng.normal(0, 12, photo.shape)).clip(0, 255).astype(np.uint8)
Image.fromarray(photo).save(f"{sys.argv[1]}/photo_500x375.jpg", quality=90)
PY
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u '+%Y-%m-%d %H:%M UTC'); old $OLD_REV vs $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+changes')"
"$OUT/ab" "$OUT/photo_500x375.jpg"
