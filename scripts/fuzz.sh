#!/usr/bin/env bash
# Builds the torch-free data-loader fuzz targets with clang + libFuzzer + ASan/UBSan and runs each
# for N seconds (default 20): scripts/fuzz.sh [seconds] [build-dir]. Exits non-zero on any crash.
set -euo pipefail
SECONDS_EACH="${1:-20}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${2:-$ROOT/build/data-fuzz}"
CXX="${FUZZ_CXX:-clang++}"
mkdir -p "$OUT"

JPEG_FLAGS=""
JPEG_LIBS=""
if pkg-config --exists libturbojpeg; then
  JPEG_FLAGS="-DTORCHSPEED_WITH_JPEG=1 $(pkg-config --cflags libturbojpeg)"
  JPEG_LIBS="$(pkg-config --libs libturbojpeg)"
  if pkg-config --exists libjpeg; then
    JPEG_FLAGS="$JPEG_FLAGS -DTORCHSPEED_WITH_LIBJPEG=1 $(pkg-config --cflags libjpeg)"
    JPEG_LIBS="$JPEG_LIBS $(pkg-config --libs libjpeg)"
  fi
fi
PNG_FLAGS="$(pkg-config --cflags libpng 2>/dev/null || true)"
PNG_LIBS="$(pkg-config --libs libpng 2>/dev/null || echo -lpng)"
FLAGS="-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I$ROOT/include -I$ROOT/csrc $JPEG_FLAGS $PNG_FLAGS"
CORE="$ROOT/csrc/data/tar_reader.cpp $ROOT/csrc/data/npy.cpp $ROOT/csrc/data/image_decode.cpp $ROOT/csrc/data/image_resample.cpp $ROOT/csrc/data/image_transform.cpp $ROOT/csrc/profile/clock.cpp"
# (the decode stage times come from the profiler's one clock, csrc/profile/clock.cpp)

# The CPU kernel layer (the image resampler runs there): each ISA unit with its own flags, as the
# CMake build compiles it (the x86-64 units only on x86-64).
KFLAGS="-std=c++17 -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -I$ROOT/csrc -ffp-contract=off"
KOBJS=""
kernel_unit() {  # name flags...
  local name=$1
  shift
  # shellcheck disable=SC2086
  "$CXX" $KFLAGS "$@" -DTORCHSPEED_CPU_ISA_NAMESPACE="isa_$name" -c \
    "$ROOT/csrc/kernels/cpu/isa_$name.cpp" -o "$OUT/isa_$name.o"
  KOBJS="$KOBJS $OUT/isa_$name.o"
}
kernel_unit scalar
DISPATCH_DEFS=""
if [ "$(uname -m)" = x86_64 ]; then
  kernel_unit avx2 -mavx2 -mfma -mf16c
  kernel_unit avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
  DISPATCH_DEFS="-DTORCHSPEED_HAVE_AVX2_UNIT -DTORCHSPEED_HAVE_AVX512_UNIT"
fi
# shellcheck disable=SC2086
"$CXX" $KFLAGS $DISPATCH_DEFS -c "$ROOT/csrc/kernels/cpu/dispatch.cpp" -o "$OUT/dispatch.o"
KOBJS="$KOBJS $OUT/dispatch.o"

# The three targets build, and later run, side by side.
TARGETS="fuzz_tar fuzz_index fuzz_decode"
pids=""
for target in $TARGETS; do
  echo "== building $target"
  # shellcheck disable=SC2086
  "$CXX" $FLAGS -I"$ROOT/csrc" "$ROOT/tests/fuzz/$target.cpp" $CORE $KOBJS -o "$OUT/$target" $JPEG_LIBS $PNG_LIBS &
  pids="$pids $!"
done
for pid in $pids; do wait "$pid"; done

# Seed corpora: a real tar, a real index and small images, made by the Python helper if available.
for target in fuzz_tar fuzz_index fuzz_decode; do mkdir -p "$OUT/corpus/$target"; done
if command -v python3 >/dev/null && python3 -c "import PIL" 2>/dev/null; then
  python3 "$ROOT/tests/fuzz/make_seeds.py" "$OUT/corpus" || echo "(seed generation failed; running unseeded)"
fi

status=0
pids=""
for target in $TARGETS; do
  echo "== running $target for ${SECONDS_EACH}s"
  "$OUT/$target" "$OUT/corpus/$target" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 \
    -print_final_stats=1 2>"$OUT/$target.log" &
  pids="$pids $!"
done
set -- $pids
for target in $TARGETS; do
  if ! wait "$1"; then
    echo "!! $target failed; see $OUT/$target.log"; tail -40 "$OUT/$target.log"; status=1
  fi
  shift
  echo "== $target"
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$OUT/$target.log" || true
done
exit $status
