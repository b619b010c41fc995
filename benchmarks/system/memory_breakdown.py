"""Where our process's memory goes on the TRL-comparison workload: resident set size after each stage.

    .venv/bin/python benchmarks/system/memory_breakdown.py                      # the "best" preset
    .venv/bin/python benchmarks/system/memory_breakdown.py --preset fp32 --steps 3
    .venv/bin/python benchmarks/system/memory_breakdown.py --preset lowmem --steps 30 [--trim]

Builds the components of ``sota/grpo.py`` one by one through the same factories (as ``_ours_worker.py`` does) and
prints the current RSS (``VmRSS``) and the peak so far (``ru_maxrss``) after each: imports, the vLLM engine,
the learner (weights, then AdamW state after the first step), the reference, and each training step; beside
them, glibc's count of the bytes handed out and not freed, and of those freed but kept (``mallinfo2``), which
tell a leak from an allocator that keeps what it was given back. ``--trim`` gives the kept pages back after each
step (``malloc_trim``) and measures again. Writes ``benchmarks/results/memory_breakdown.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import malloc_gib, malloc_trim, peak_rss_gib, set_threads  # noqa: E402
from benchmarks.versus_trl._ours_worker import compose, workload_overrides  # noqa: E402


def rss_gib() -> float:
    """Current resident set size of this process in GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="best", help="a preset of trl_compare.py: fp32 | best | lowmem")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) after each step, then measure again")
    parser.add_argument("--json", default=str(RESULTS / "memory_breakdown.json"))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides on top of the preset's")
    args = parser.parse_args()
    set_threads(args.threads)
    rows: list[dict] = []

    def mark(stage: str) -> None:
        in_use, held = malloc_gib()
        rows.append(
            {
                "stage": stage,
                "rss_gib": rss_gib(),
                "peak_gib": peak_rss_gib(),
                "malloc_in_use_gib": in_use,
                "malloc_free_held_gib": held,
            }
        )
        print(
            f"{stage:40s} rss {rows[-1]['rss_gib']:6.2f} GiB   peak {rows[-1]['peak_gib']:6.2f} GiB   "
            f"malloc in use {in_use:6.2f}, freed but held {held:6.2f} GiB",
            flush=True,
        )

    mark("python")
    import torch  # noqa: F401

    from benchmarks.versus_trl.trl_compare import COMMON_OURS, PRESETS
    from grpo_rl.engines.build import make_engine
    from grpo_rl.envs import make_env
    from grpo_rl.rollout.collector import make_collector
    from grpo_rl.run.setup import make_run
    from grpo_rl.training.build import make_local_learner, make_ref_scorer, seed_everything
    from grpo_rl.training.step import score_batch

    mark("imports (torch, grpo_rl)")

    cfg = compose(
        workload_overrides(tempfile.mkdtemp(prefix="memory_breakdown_"))
        + COMMON_OURS
        + PRESETS[args.preset]
        + args.overrides
    )
    run = make_run(cfg, cfg.output_dir)
    shared = cfg.inference_model.share_weights  # the lowmem preset: the engine generates with the learner's model
    if not shared:
        engine = make_engine(run)
        mark(
            f"+ {cfg.inference_model.engine} engine ({run.precision.inference.dtype}, "
            f"KV {cfg.inference_model.kv_cache_gb} GiB)"
        )
    seed_everything(cfg.seed)
    learner = make_local_learner(run)
    mark(f"+ learner ({next(learner.model.parameters()).dtype} weights)")
    if shared:
        engine = make_engine(run, policy=learner.model)
    ref = make_ref_scorer(run)
    mark("+ reference")
    collector = make_collector(run, engine, env=make_env(cfg, run.tokenizer))
    for step in range(args.steps):
        t0 = time.perf_counter()
        batch, _ = collector.collect(step, learner.version)
        mark(f"step {step}: collected")
        batch, _ = score_batch(batch, ref, run.cfg.policy, run.cfg.sampling.max_new_tokens)
        mark(f"step {step}: reference scored")
        learner.train_step(batch)
        mark(f"step {step}: trained (+ grads, optimizer state)")
        engine.update_weights(learner.named_weights())
        mark(f"step {step}: weights pushed")
        rows[-1]["step_seconds"] = time.perf_counter() - t0
        print(f"step {step}: {rows[-1]['step_seconds']:.2f} s", flush=True)
        if args.trim:
            malloc_trim()
            mark(f"step {step}: after malloc_trim")
    engine.shutdown()
    out = {
        "preset": args.preset,
        "trim": args.trim,
        "overrides": COMMON_OURS + PRESETS[args.preset] + args.overrides,
        "threads": args.threads,
        "stages": rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
