"""What freezing the heap before vLLM starts saves: the in-process engine's start (``VLLMEngine(...)``, after the
imports) with ``gc.freeze()`` as the engine calls it, and with that call made a no-op, each in a fresh process.

    .venv/bin/python benchmarks/micro/engine_start.py                      # the embedded SmolLM2-135M-Instruct
    .venv/bin/python benchmarks/micro/engine_start.py --model /path/to/hf_folder --repeats 5

vLLM collects garbage several times while it starts; a process that has imported torch, transformers and vLLM holds
millions of objects that those collections walk for nothing. Both arms alternate by repeat, one thread each; the
best wall and CPU seconds of each are printed. Asserts nothing.
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
import gc, json, sys, time
import torch
from grpo_rl.engines import vllm_engine
from grpo_rl.model.loading import resolve_model
import vllm.entrypoints.llm  # imported before the clock starts, as a run has by then
if sys.argv[2] == "off":
    gc.freeze = lambda: None
path = resolve_model(sys.argv[1])
t0, c0 = time.perf_counter(), time.process_time()
engine = vllm_engine.VLLMEngine(path, torch.device("cpu"), max_model_len=1024, kv_cache_gb=0.5)
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}))
engine.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    announce_machine()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    seconds: dict[str, list[dict]] = {"frozen": [], "not frozen": []}
    for _ in range(args.repeats):
        for name, arm in (("frozen", "on"), ("not frozen", "off")):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, args.model, arm], env=env, capture_output=True, text=True, check=True
            )
            seconds[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"vLLM engine start, {args.model}, best of {args.repeats}:")
    best = {}
    for name, runs in seconds.items():
        best[name] = {k: min(r[k] for r in runs) for k in ("wall", "cpu")}
        print(f"{name:12}{best[name]['wall']:8.2f} s wall{best[name]['cpu']:8.2f} s CPU")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "engine_start.json").write_text(json.dumps(best, indent=1))


if __name__ == "__main__":
    main()
