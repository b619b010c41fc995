"""Synchronous vs asynchronous GRPO: the same model, data, group size and optimizer steps, two loops.

    python benchmarks/system/sync_vs_async.py                         # tiny random model (hidden 64), 10 steps
    python benchmarks/system/sync_vs_async.py --hidden 128 --layers 4 --steps 12 --json /tmp/sva.json \\
        env.prompts_per_step=2 sampling.max_new_tokens=96      # extra Hydra overrides go to both scripts

Each loop runs as its script (sota/grpo.py, sota/grpo-async.py) in a subprocess, one after the other, with
identical overrides. Measured from their metrics.jsonl, after ``--warmup`` steps (kernel compilation, the
asynchronous pipeline filling up):

* samples/s: trained samples / wall time of the measured steps;
* learner busy: (reference + training seconds) / wall time, how much of the time the learner computes;
* generation and training seconds per step (where their sum goes in the synchronous loop);
* final reward: mean reward of the last 3 steps (same data and seeds; the asynchronous run trains on samples
  up to ``pipeline.max_staleness`` versions old, so its curve may differ).

``--sync-one-thread`` adds the synchronous loop with one torch thread: the asynchronous loop gives each of
its two busy processes one thread, and on a 2-core machine that other jobs also use, a 2-thread process slows
far more than a 1-thread one (busy_neighbour.py), so that run separates the gain from overlapping generation with
training from the gain of avoiding thread contention.

Prints the CPU line, a table, and writes JSON (per-step times included). Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS, ROOT  # noqa: E402
from benchmarks.common.runner import run_script  # noqa: E402


def build_model(out: Path, hidden: int, layers: int, heads: int) -> Path:
    from grpo_rl.model.loading import build_tiny_model, resolve_model

    return build_tiny_model(
        resolve_model("embedded:smollm2-135m-instruct"),
        out,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=2 * hidden,
    )


def summarize(rows: list[dict], warmup: int, samples_per_step: int) -> dict:
    measured = rows[warmup:]
    wall = sum(r["step_seconds"] for r in measured)
    learner = sum(r.get("reference_seconds", 0.0) + r["training_seconds"] for r in measured)
    out = {
        "measured_steps": len(measured),
        "samples_per_second": samples_per_step * len(measured) / wall,
        # samples/s alone hides answer length, which differs between the loops once their samples differ
        "trained_tokens_per_second": samples_per_step * sum(r["response_length_mean"] for r in measured) / wall,
        "response_length_mean": statistics.mean(r["response_length_mean"] for r in measured),
        "step_seconds": wall / len(measured),
        "learner_busy_fraction": learner / wall,
        "training_seconds": statistics.mean(r["training_seconds"] for r in measured),
        "reference_seconds": statistics.mean(r.get("reference_seconds", 0.0) for r in measured),
        "final_reward": statistics.mean(r["reward_mean"] for r in rows[-3:]),
        "per_step_seconds": [round(r["step_seconds"], 3) for r in measured],
    }
    if "staleness_mean" not in measured[0]:  # synchronous: generation is part of the step
        out["generation_seconds"] = statistics.mean(r["generation_seconds"] for r in measured)
        out["per_step_generation_seconds"] = [round(r["generation_seconds"], 3) for r in measured]
    if "staleness_mean" in measured[0]:
        out["staleness_mean"] = statistics.mean(r["staleness_mean"] for r in measured)
        out["staleness_max"] = max(r["staleness_max"] for r in measured)
        out["dropped_samples"] = sum(r["dropped_samples"] for r in measured)
        out["learner_wait_seconds"] = statistics.mean(r["learner_wait_seconds"] for r in measured)
        out["collector_busy_fraction"] = statistics.mean(r["collector_busy_fraction"] for r in measured)
        out["collector_wait_seconds"] = statistics.mean(r["collector_wait_seconds"] for r in measured)
    out["weight_sync_seconds"] = statistics.mean(r["weight_sync_seconds"] for r in measured)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="HF folder; default: a random model built from the options below")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--sync-one-thread",
        action="store_true",
        help="also run the synchronous loop with one torch thread (async gives each role one)",
    )
    parser.add_argument("--json", default=str(RESULTS / "sync_vs_async.json"))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides passed to both scripts")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sync_vs_async-") as tmp:
        tmp = Path(tmp)
        model = args.model or str(build_model(tmp / "model", args.hidden, args.layers, args.heads))
        overrides = [
            f"model.name={model}",
            f"train.steps={args.steps}",
            "logger.backend=none",
            "logger.num_examine=0",
            "eval.every=0",
            "train.checkpoint_frequency=0",
            *args.overrides,
        ]
        from omegaconf import OmegaConf

        from grpo_rl.config.schema import GRPOConfig

        yaml = OmegaConf.load(ROOT / "config" / "grpo_gsm8k.yaml")
        for hydra_key in ("defaults", "hydra"):
            yaml.pop(hydra_key, None)
        cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), yaml, OmegaConf.from_dotlist(overrides))
        samples_per_step = cfg.env.prompts_per_step * cfg.env.group_size
        results = {"overrides": overrides, "cpu_count": os.cpu_count(), "load_average_start": os.getloadavg()}
        modes = [("sync", "grpo.py", None)] + ([("sync_1thread", "grpo.py", 1)] if args.sync_one_thread else [])
        for mode, script, threads in modes + [("async", "grpo-async.py", None)]:
            run = run_script(script, overrides, run_dir=tmp / mode, timeout=args.timeout, threads=threads)
            results[mode] = {**summarize(run.rows, args.warmup, samples_per_step), "process_seconds": run.seconds}
            print(f"{mode}: done in {run.seconds:.0f}s", flush=True)
        results["load_average_end"] = os.getloadavg()
    results["speedup"] = results["async"]["samples_per_second"] / results["sync"]["samples_per_second"]
    shown = [m for m in ("sync", "sync_1thread", "async") if m in results]

    keys = [
        "samples_per_second",
        "trained_tokens_per_second",
        "response_length_mean",
        "step_seconds",
        "learner_busy_fraction",
        "generation_seconds",
        "training_seconds",
        "reference_seconds",
        "final_reward",
        "staleness_mean",
        "staleness_max",
        "dropped_samples",
        "learner_wait_seconds",
        "collector_busy_fraction",
        "collector_wait_seconds",
        "weight_sync_seconds",
        "process_seconds",
    ]
    print(f"\n{'metric':26s} " + " ".join(f"{m:>12s}" for m in shown))
    for k in keys:
        cells = [results[m].get(k) for m in shown]
        print(f"{k:26s} " + " ".join(f"{c:12.3f}" if isinstance(c, (int, float)) else f"{'-':>12s}" for c in cells))
    print(f"{'async / sync samples/s':26s} {results['speedup']:12.2f}x")
    if "sync_1thread" in results:
        results["speedup_vs_sync_1thread"] = (
            results["async"]["samples_per_second"] / results["sync_1thread"]["samples_per_second"]
        )
        print(f"{'async / sync_1thread':26s} {results['speedup_vs_sync_1thread']:12.2f}x")
    for m in shown[:-1]:
        ratio = results["async"]["trained_tokens_per_second"] / results[m]["trained_tokens_per_second"]
        results[f"token_speedup_vs_{m}"] = ratio
        print(f"{'async / ' + m + ' tokens/s':26s} {ratio:12.2f}x")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
