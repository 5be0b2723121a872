#!/usr/bin/env bash
# Format checks: clang-format (C++/CUDA, .clang-format) and ruff (Python). --fix rewrites files.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mode=${1:---check}
mapfile -t cxx < <(git ls-files --cached --others --exclude-standard 'csrc/*.cpp' 'csrc/*.h' 'csrc/*.cu' 'csrc/*.cuh' 'include/*.h' 'tests/*.cpp' 'tests/*.h' 'examples/*.cpp')
if [ "$mode" = "--fix" ]; then
  clang-format -i "${cxx[@]}"
  "$PY" -m ruff check --fix python tests bench scripts
  "$PY" -m ruff format python tests bench scripts
else
  clang-format --dry-run --Werror "${cxx[@]}"
  "$PY" -m ruff check python tests bench scripts
  "$PY" -m ruff format --check python tests bench scripts
fi
echo "format: ok (${#cxx[@]} C++/CUDA files, ruff on python/ tests/ bench/ scripts/)"
