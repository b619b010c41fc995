#!/usr/bin/env bash
# Create the TRL side's own virtual environment for benchmarks/versus_trl/trl_compare.py (idempotent).
#
#     bash benchmarks/versus_trl/setup_trl_env.sh            # -> benchmarks/.venv-trl (gitignored)
#
# Pinned: torch 2.13.0 (the CPU build on local disk, the same as our side), trl 1.16.0, transformers 5.19.0
# (the same as our side, so both load SmolLM2 with identical modelling code). No vLLM: TRL generates with
# transformers' generate(), as GRPOTrainer does with use_vllm=False.
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=${TRL_VENV:-benchmarks/.venv-trl}
PINS=("torch==2.13.0" "trl==1.16.0" "transformers==5.19.0" "accelerate==1.15.0" "datasets==5.2.0")

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
stamp="$VENV/.trl-installed"
want=$(printf '%s\n' "${PINS[@]}" | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # torch first and alone: the CPU wheel; anything else would resolve a multi-GB CUDA build.
  "$PY" -m pip install -q "torch==2.13.0"
  "$PY" -m pip install -q "${PINS[@]}"
  echo "$want" > "$stamp"
fi
"$PY" -c "import torch, trl, transformers; print('trl', trl.__version__, '| transformers', transformers.__version__, '| torch', torch.__version__)"
