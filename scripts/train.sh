#!/usr/bin/env bash
# Install everything, prepare the embedded model, and run synchronous GRPO on its defaults.
# Extra arguments are Hydra overrides: scripts/train.sh train.steps=10 optimizer.lr=1e-5
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
exec .venv/bin/python sota/grpo.py "$@"
