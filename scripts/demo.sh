#!/usr/bin/env bash
# The main job on a fresh machine: installs what is missing, builds torchspeed, and runs
# `torchspeed demo` (torchspeed vs torch side by side; tables printed, JSON in ./torchspeed_results/).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHON=${PYTHON:-python3}
bash scripts/install_deps.sh
bash scripts/build.sh
"$PYTHON" -m torchspeed.cli demo "$@"
