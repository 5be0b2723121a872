#!/usr/bin/env bash
# Installs what a fresh machine lacks to build and test torchspeed: Debian packages (compilers,
# CMake, Ninja, ccache, Catch2 v2 or v3, libjpeg-turbo, libpng, Gloo's headers (torch's ProcessGroupGloo.hpp
# includes them; the wheel lacks them), clang for the fuzzers, valgrind for the
# profiler's instruction counts) and the pinned Python packages (torch==2.13.0 CPU, the test
# tools, matplotlib and tensorboard for the profiler's outputs). Idempotent and quick when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in cmake ninja-build ccache catch2 libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev libgloo-dev clang libclang-rt-14-dev pkg-config valgrind; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=""; fi
  echo "install_deps: apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  # libclang-rt-14-dev is Debian 12's name; newer releases ship the fuzzer runtime with clang.
  $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null 2>&1 || \
    $SUDO apt-get install -y -qq $(printf '%s\n' "${need_apt[@]}" | grep -v libclang-rt-14-dev) >/dev/null
fi

PY=${PYTHON:-python3}
if ! "$PY" -c "import torch, pytest, ruff, numpy, PIL, hypothesis, matplotlib, tensorboard, tqdm, lightning" >/dev/null 2>&1 || \
   [ "$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" != "2.13.0" ]; then
  echo "install_deps: pip install -r requirements-dev.txt"
  "$PY" -m pip install -q -r requirements-dev.txt 2>&1 | grep -v "Running pip as the 'root' user" || true
fi
"$PY" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
