#!/usr/bin/env bash
# The main job on a fresh machine: installs what is missing, builds torchspeed, and runs
# `torchspeed demo`: the same small CNN trained as idiomatic PyTorch (DataLoader + PIL, torch AdamW)
# and with torchspeed (native loader, fused AdamW, step profiler), side by side. The first run
# generates its dataset (~10,000 JPEGs, cached in ~/.cache/torchspeed). Table and doctor report
# printed; summary.json, demo.png and Chrome traces in ./torchspeed_results/demo/.
# Arguments go to the demo: `bash scripts/demo.sh --quick`, `--device cuda`, `--benchmarks`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHON=${PYTHON:-python3}
bash scripts/install_deps.sh
bash scripts/build.sh
"$PYTHON" -m torchspeed.cli demo "$@"
