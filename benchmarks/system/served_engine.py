"""In-process vLLM vs a vLLM server: step time and tokens/s of the default workload, and the time of a weight push.

    python benchmarks/system/served_engine.py                      # the default run (SmolLM2-135M, GSM8K), 6 steps each
    python benchmarks/system/served_engine.py --steps 4 --pushes 3 --json /tmp/served.json

Part 1 runs ``sota/grpo.py`` twice with the default config, one after the other, with ``inference_model.engine``
``vllm`` (in the learner's process) and ``vllm_server`` (a server the run starts, spoken to over HTTP), and
compares the measured steps (after ``--warmup``) from their metrics.jsonl: step seconds, generation seconds,
tokens/s, weight-sync seconds. The same seed samples the same tokens on both, so the work is the same.

Part 2 times one weight push of SmolLM2-135M (float32, every tensor) ``--pushes`` times per transport:
``in_process`` (:class:`~grpo_rl.engines.vllm_engine.VLLMEngine`'s in-place reload) and ``served_file``
(:class:`~grpo_rl.engines.served.ServedEngine`: a safetensors file in /dev/shm, vLLM's RL routes, the version read
back). The object-store transport of the asynchronous loop is timed by weight_transport.py.

Prints the CPU, its matmul instruction sets and the load average before starting (measure on an idle machine),
a table, and writes JSON. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine, machine  # noqa: E402
from benchmarks.common.runner import run_script  # noqa: E402


def run_sync(engine: str, steps: int, run_dir: Path, extra: list[str]) -> list[dict]:
    overrides = [
        f"inference_model.engine={engine}",
        f"train.steps={steps}",
        "eval.every=0",
        "logger.backend=none",
        *extra,
    ]
    return run_script("grpo.py", overrides, run_dir=run_dir, timeout=3600).rows


def summarize(rows: list[dict], warmup: int) -> dict:
    measured = rows[warmup:]
    mean = lambda key: statistics.mean(r[key] for r in measured)  # noqa: E731
    return {
        "steps": len(measured),
        "step_seconds": mean("step_seconds"),
        "generation_seconds": mean("generation_seconds"),
        "tokens_per_second": mean("tokens_per_second"),
        "generation_tokens_per_second": mean("generation_tokens_per_second"),
        "weight_sync_seconds": mean("weight_sync_seconds"),
        "reward_mean": mean("reward_mean"),
        "per_step_seconds": [round(r["step_seconds"], 2) for r in measured],
    }


def time_pushes(pushes: int, tmp: Path) -> dict:
    import torch

    from grpo_rl.engines.served import ServedEngine
    from grpo_rl.engines.server import ServerFleet, ServerSpec, engine_args
    from grpo_rl.engines.vllm_engine import VLLMEngine
    from grpo_rl.model.loading import load_causal_lm, resolve_model

    path = resolve_model("embedded:smollm2-135m-instruct")
    weights = list(load_causal_lm(path, torch.device("cpu"), "float32").state_dict().items())
    out = {}
    args = engine_args(
        dtype="float32",
        max_model_len=1024,
        seed=0,
        kv_cache_gb=0.5,
        gpu_memory_utilization=0.5,
        enforce_eager=True,
        enable_prefix_caching=True,
        on_cpu=True,
    )
    fleet = ServerFleet(
        [ServerSpec(path, torch.device("cpu"), threads=torch.get_num_threads(), vllm_args=args)], tmp, start_timeout=600
    )
    try:
        engine = ServedEngine(fleet.urls, key=fleet.key, pad_id=0)
        times = []
        for version in range(1, pushes + 1):
            t0 = time.perf_counter()
            engine.update_weights(weights, version)
            times.append(time.perf_counter() - t0)
        engine.shutdown()
        out["served_file"] = times
    finally:
        fleet.close()
    local = VLLMEngine(path, torch.device("cpu"), max_model_len=1024, kv_cache_gb=0.5)
    times = []
    for _ in range(pushes):
        t0 = time.perf_counter()
        local.update_weights(weights)
        times.append(time.perf_counter() - t0)
    local.shutdown()
    out["in_process"] = times
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--json", default=str(RESULTS / "served_engine.json"))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both runs")
    args = parser.parse_args()
    info = {**machine(), "loadavg_before": os.getloadavg()}
    announce_machine()
    result = {"machine": info, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="served_engine-") as tmp:
        tmp = Path(tmp)
        for engine in ("vllm", "vllm_server"):
            rows = run_sync(engine, args.steps, tmp / engine, args.overrides)
            result["runs"][engine] = summarize(rows, args.warmup)
        result["pushes"] = time_pushes(args.pushes, tmp / "pushes")
    print(f"\n{'engine':<14}{'step s':>9}{'gen s':>9}{'tok/s':>9}{'gen tok/s':>11}{'push s':>9}  per step")
    for engine, r in result["runs"].items():
        print(
            f"{engine:<14}{r['step_seconds']:>9.2f}{r['generation_seconds']:>9.2f}{r['tokens_per_second']:>9.1f}"
            f"{r['generation_tokens_per_second']:>11.1f}{r['weight_sync_seconds']:>9.3f}  {r['per_step_seconds']}"
        )
    print("\nweight push of SmolLM2-135M (float32), seconds:")
    for transport, times in result["pushes"].items():
        print(f"  {transport:<12} median {statistics.median(times):.3f}  all {[round(t, 3) for t in times]}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
