# Sourced by the other scripts: offline-friendly defaults and the shared data folder when it exists.
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TOKENIZERS_PARALLELISM=false
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}
if [ -z "${GRPO_DATA_DIR:-}" ] && [ -d "$(pwd)/../shared/data" ]; then
  export GRPO_DATA_DIR="$(cd ../shared/data && pwd)"
fi
