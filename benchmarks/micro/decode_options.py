"""What vLLM's CPU engine offers for decoding, against the decode floor: the run's engine (``VLLMEngine``, as a run
builds it) with one option changed per arm, each arm in a fresh process, decoding the default batch.

    .venv/bin/python benchmarks/micro/decode_options.py                        # every arm, fp32, 2 repeats
    .venv/bin/python benchmarks/micro/decode_options.py --arms run,compiled --precision bfloat16 --repeats 3

The batch is a run's default: 4 GSM8K prompts x 8 answers (``env.prompts_per_step`` x ``env.group_size``), 128
tokens each (``sampling.max_new_tokens``), temperature 1, the sampled token's log-prob kept, every answer forced to
its full length (``min_tokens``) so that each arm decodes the same tokens. Per arm: the engine's start, then the
best and the worst of ``--repeats`` timed generations after an untimed one; a decoding step's time is the full
generation's less a prefill-only one (one new token), over the other 127 steps. The floor of a step is
``flops.py``'s: every linear layer and the LM head at the batch's 32 rows, at the best rate measured here. Asserts
nothing.
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

# arm -> (engine arguments over the run's, environment over the run's); the arms named transformers* run
# `inference_model.engine=transformers` (TransformersEngine) instead of vLLM
ARMS: dict[str, tuple[dict, dict]] = {
    "run": ({}, {}),  # the run's engine: eager, vLLM's CPU block size (128), chunked prefill off
    "compiled": ({"enforce_eager": False}, {}),  # vLLM's CPU compilation (dynamo, then inductor)
    "block32": ({"block_size": 32}, {}),
    "block256": ({"block_size": 256}, {}),
    "max_seqs32": ({"max_num_seqs": 32}, {}),  # the scheduler sized to the batch (vLLM's CPU default is larger)
    "nobind": ({}, {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}),  # OpenMP threads left where the OS puts them
    "transformers": ({}, {}),  # generate with a dynamic KV cache, eager
    "transformers_static": ({"compile": True}, {}),  # inference_model.compile: a static KV cache (on the CPU, eager)
    # ... and its decoding step compiled by torch.compile (inductor), which transformers does on the CPU only when
    # asked (CompileConfig._compile_all_devices)
    "transformers_compiled": ({"compile": True, "compile_cpu": True}, {}),
}

PROMPTS, ANSWERS, NEW_TOKENS = 4, 8, 128

# A child process: the run's prompts as token ids, then the engine's arm (defines `start` and `generate(tokens)`),
# then the timing.
PROMPT_IDS = """
import json, sys, time
import torch
from grpo_rl.model.loading import load_tokenizer, resolve_model

overrides, prompts_per_step, answers, new_tokens, repeats, precision, data = json.loads(sys.argv[1])
path = resolve_model("embedded:smollm2-135m-instruct")
tokenizer = load_tokenizer(path)
rows = [json.loads(line) for line in open(data) if line.strip()][:prompts_per_step]
texts = [
    tokenizer.apply_chat_template([{"role": "user", "content": r["question"]}], add_generation_prompt=True,
                                  tokenize=False)
    for r in rows
]
prompt_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
"""

VLLM_ARM = """
import vllm
from vllm import SamplingParams
from grpo_rl.engines import vllm_engine

build = vllm.LLM
vllm.LLM = lambda **kw: build(**{**kw, **overrides})  # VLLMEngine imports LLM from vllm when it starts one
prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
t0 = time.perf_counter()
engine = vllm_engine.VLLMEngine(path, torch.device("cpu"), dtype=precision, max_model_len=1024, kv_cache_gb=0.5)
start = time.perf_counter() - t0

def generate(tokens: int) -> float:
    params = SamplingParams(n=answers, max_tokens=tokens, min_tokens=tokens, temperature=1.0, logprobs=0, seed=0)
    t = time.perf_counter()
    outputs = engine.llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t
    assert all(len(c.token_ids) == tokens for o in outputs for c in o.outputs)
    return seconds
"""

# The transformers engine: its own `generate`, forced to full length by `min_new_tokens`.
TRANSFORMERS_ARM = """
from transformers import CompileConfig
from grpo_rl.engines.base import SamplingSpec
from grpo_rl.engines.transformers_engine import TransformersEngine

t0 = time.perf_counter()
engine = TransformersEngine(path, torch.device("cpu"), dtype=precision, compile=overrides.get("compile", False))
if overrides.get("compile_cpu"):
    config = CompileConfig(mode="default")
    config._compile_all_devices = True
    engine.model.generation_config.compile_config = config
start = time.perf_counter() - t0
model_generate = engine.model.generate

def full_length(**kw):
    return model_generate(**kw, min_new_tokens=kw["max_new_tokens"])

engine.model.generate = full_length

def generate(tokens: int) -> float:
    t = time.perf_counter()
    out = engine.generate(prompt_ids, answers, SamplingSpec(max_new_tokens=tokens, temperature=1.0, seed=0))
    seconds = time.perf_counter() - t
    assert int(out["response_mask"].sum(-1).min()) == tokens, "an answer ended early"
    return seconds
"""

TIMING = """
generate(new_tokens)  # untimed: first-call work (and a compile)
full = [generate(new_tokens) for _ in range(repeats)]
prefill = min(generate(1) for _ in range(repeats))
print("@@" + json.dumps({"start": start, "full": full, "prefill": prefill}))
"""


def run_arm(name: str, args) -> dict:
    overrides, env_extra = ARMS[name]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), **env_extra)
    payload = [overrides, PROMPTS, ANSWERS, NEW_TOKENS, args.repeats, args.precision, str(args.data)]
    arm = TRANSFORMERS_ARM if name.startswith("transformers") else VLLM_ARM
    proc = subprocess.run(
        [sys.executable, "-c", PROMPT_IDS + arm + TIMING, json.dumps(payload)],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@")]
    if proc.returncode != 0 or not lines:
        return {"arm": name, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    out = json.loads(lines[-1][2:])
    steps = NEW_TOKENS - 1
    return {
        "arm": name,
        "start_s": out["start"],
        "generate_best_s": min(out["full"]),
        "generate_worst_s": max(out["full"]),
        "step_ms_best": (min(out["full"]) - out["prefill"]) / steps * 1e3,
        "step_ms_worst": (max(out["full"]) - out["prefill"]) / steps * 1e3,
    }


def floor_step_ms(threads: int, precision: str) -> float:
    """One decoding step's linear layers at the batch's rows, at the best rate measured here."""
    from benchmarks.micro.flops import best_rates
    from grpo_rl.model.loading import resolve_model

    cfg = json.loads((Path(resolve_model("embedded:smollm2-135m-instruct")) / "config.json").read_text())
    rows = PROMPTS * ANSWERS
    name = "bf16" if precision == "bfloat16" else "fp32"
    rates = best_rates(cfg, threads, decode_rows=rows, precisions=(name,))
    d, layers, ff, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    head_dim = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim
    params = layers * (2 * d * d + 2 * kv * d + 3 * ff * d) + vocab * d
    rate = rates[f"{name}_decode"]
    return 2 * rows * params / rate * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    default_data = Path(os.environ.get("GRPO_DATA_DIR", ROOT.parent / "shared" / "data")) / "gsm8k" / "train.jsonl"
    parser.add_argument("--data", type=Path, default=default_data, help="GSM8K jsonl with a 'question' column")
    parser.add_argument("--json", default=str(RESULTS / "decode_options.json"))
    args = parser.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arms {unknown}; choose from {', '.join(ARMS)}")
    if not args.data.exists():
        raise SystemExit(f"no GSM8K data at {args.data}: pass --data or set GRPO_DATA_DIR")
    cpu = announce_machine()
    print(
        f"{PROMPTS} prompts x {ANSWERS} answers x {NEW_TOKENS} tokens, {args.precision}, {args.threads} threads, "
        f"best / worst of {args.repeats}",
        flush=True,
    )
    floor = floor_step_ms(args.threads, args.precision)
    print(f"floor of a decoding step at {PROMPTS * ANSWERS} rows: {floor:.1f} ms")
    print(f"{'arm':12s} {'start s':>8s} {'generate s':>14s} {'step ms':>14s} {'x floor':>8s}")
    results = []
    for name in arms:
        r = run_arm(name, args)
        results.append(r)
        if "error" in r:
            print(f"{name:12s} failed: {r['error']}", flush=True)
            continue
        print(
            f"{name:12s} {r['start_s']:8.1f} {r['generate_best_s']:6.2f} / {r['generate_worst_s']:5.2f} "
            f"{r['step_ms_best']:6.1f} / {r['step_ms_worst']:5.1f} {r['step_ms_best'] / floor:8.2f}",
            flush=True,
        )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    record = {"cpu": cpu, "precision": args.precision, "threads": args.threads, "floor_step_ms": floor}
    Path(args.json).write_text(json.dumps({**record, "arms": results}, indent=1) + "\n")
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
