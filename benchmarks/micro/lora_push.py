"""A LoRA run's weight push, the adapter alone against the merged model (``model.lora.push``), into the in-process
vLLM engine: bytes and seconds a push, and what sampling with the adapter costs a generation.

    .venv/bin/python benchmarks/micro/lora_push.py                  # the embedded SmolLM2-135M-Instruct, r=16
    .venv/bin/python benchmarks/micro/lora_push.py --model /path/to/hf_folder --rank 64 --repeats 3

Each arm runs in a fresh process (one thread), the arms alternating by repeat: the learner's model with the
default LoRA targets (the seven projections) and random adapter matrices, and a vLLM engine started as a LoRA run
starts it. A push is timed from the learner's tensors to the engine holding them (merged: the out-of-place merge,
then vLLM's in-place reload; adapter: the adapter's tensors written as a peft folder, then loaded by vLLM);
``bytes`` is what a push carries between processes (the tensors' bytes: what the asynchronous loop puts into
Ray's object store). Generation is one call of 4 prompts x 4 answers of 32 tokens after each push, sampled at
temperature 1: vLLM applies an adapter with its own LoRA kernels, Triton on a GPU and plain torch on the CPU, so
what a push saves may be lost in every decoding step. The medians of 3 pushes per process, the best process of each
arm. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine  # noqa: E402

CHILD = """
import json, statistics, sys, time
import torch
from grpo_rl.engines.base import SamplingSpec
from grpo_rl.engines.vllm_engine import AdapterSlots, VLLMEngine
from grpo_rl.model.loading import load_causal_lm, resolve_model
from grpo_rl.model.lora import adapter_named_weights, apply_lora, merged_state_dict
from grpo_rl.config.schema import LoraConfig

arm, rank = sys.argv[2], int(sys.argv[3])
path = resolve_model(sys.argv[1])
torch.manual_seed(0)
defaults = LoraConfig()
model = load_causal_lm(path, torch.device("cpu"), "float32", trainable=True)
model = apply_lora(model, r=rank, alpha=2.0 * rank, dropout=0.0, target_modules=defaults.target_modules)
adapters = AdapterSlots(2.0 * rank, rank) if arm == "adapter" else None
engine = VLLMEngine(path, torch.device("cpu"), max_model_len=1024, kv_cache_gb=1, adapters=adapters)
prompts = [[1 + (7 * i + j) % 2000 for j in range(64)] for i in range(4)]
spec = SamplingSpec(max_new_tokens=32, temperature=1.0, seed=1)
engine.generate(prompts[:1], 1, spec)  # warm
push, gen, nbytes = [], [], 0
for version in range(1, 4):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(0.01 * torch.randn_like(p))
    t0 = time.perf_counter()
    named = adapter_named_weights(model) if arm == "adapter" else list(merged_state_dict(model).items())
    engine.update_weights(named, version=version)
    push.append(time.perf_counter() - t0)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    t0 = time.perf_counter()
    out = engine.generate(prompts, 4, spec)
    gen.append(time.perf_counter() - t0)
tokens = int(out["response_mask"].sum())
print(json.dumps({"push_s": statistics.median(push), "bytes": nbytes, "generate_s": statistics.median(gen),
                  "tokens": tokens}))
engine.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    announce_machine()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    runs: dict[str, list[dict]] = {"merged": [], "adapter": []}
    for _ in range(args.repeats):
        for arm in runs:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, args.model, arm, str(args.rank)],
                env=env,
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                sys.exit(f"the {arm} arm failed:\n{out.stderr[-3000:]}")
            runs[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"LoRA push into the in-process vLLM engine, {args.model}, r={args.rank}, best of {args.repeats}:")
    print(f"{'push':10}{'MB a push':>12}{'s a push':>11}{'generate s':>12}{'tok/s':>9}")
    best = {}
    for arm, rows in runs.items():
        b = min(rows, key=lambda r: r["push_s"] + r["generate_s"])
        best[arm] = b
        print(
            f"{arm:10}{b['bytes'] / 1e6:12.2f}{b['push_s']:11.3f}{b['generate_s']:12.2f}"
            f"{b['tokens'] / b['generate_s']:9.0f}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lora_push.json").write_text(json.dumps({"rank": args.rank, **best}, indent=1))


if __name__ == "__main__":
    main()
