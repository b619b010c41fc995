"""The default asynchronous run against another commit's: the same ``sota/grpo-async.py`` (default config, the
embedded model, GSM8K), seed and steps in both checkouts, and what each trace shows.

    python benchmarks/system/default_async.py --base 55844e4 --steps 8
    python benchmarks/system/default_async.py --base HEAD --base-overrides pipeline.whole_batches=true  # whole batches

``--base`` is checked out into a temporary git worktree; the two runs go one after the other (base first), each with
the machine to itself. Per run it prints trained samples per second (the learner's, steps 2 on: the first waits for
the engines to start), the learner's and the engines' idle fractions, dropped samples, the reward of every step, and
from ``trace.json`` the seconds each process spent in each phase. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import ROOT  # noqa: E402
from benchmarks.common.machine import cpu_line  # noqa: E402
from benchmarks.common.runner import checkout, run_script  # noqa: E402


def trace_phases(path: Path) -> dict[str, dict[str, float]]:
    """``{process: {phase: seconds}}`` from a run's ``trace.json``."""
    events = json.loads(path.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        if e.get("ph") == "X":
            out[names.get(e["pid"], str(e["pid"]))][e["name"]] += e["dur"] / 1e6
    return {p: dict(v) for p, v in out.items()}


def summary(rows: list[dict]) -> dict:
    measured = rows[1:]  # the first step waits for the engines' start
    mean = lambda key: statistics.mean(r.get(key, 0.0) for r in measured)  # noqa: E731
    return {
        "samples_per_second": mean("learner_samples_per_second"),
        "learner_idle_fraction": mean("learner_idle_fraction"),
        "engine_idle_fraction": mean("engine_idle_fraction"),
        "step_seconds": mean("step_seconds"),
        "dropped_samples": sum(r.get("dropped_samples", 0) for r in rows),
        "staleness_mean": mean("staleness_mean"),
        "reward": [round(r["reward_mean"], 4) for r in rows],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against (any git revision)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-overrides", nargs="*", default=[], help="Hydra overrides for the base run only")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, given to both runs")
    args = parser.parse_args()
    overrides = [f"train.steps={args.steps}", f"seed={args.seed}", "logger.backend=none", *args.overrides]
    results = {}
    with tempfile.TemporaryDirectory(prefix="default-async-") as tmp:
        with checkout(args.base, Path(tmp) / "base") as base_root:
            for side, root in (("base", base_root), ("head", ROOT)):
                run_dir = Path(tmp) / side
                own = args.base_overrides if side == "base" else []
                rows = run_script("grpo-async.py", [*overrides, *own], run_dir=run_dir, root=root).rows
                results[side] = summary(rows)
                trace = run_dir / "trace.json"
                results[side]["phases"] = trace_phases(trace) if trace.exists() else {}
    for side, r in results.items():
        print(
            f"{side}: {r['samples_per_second']:.2f} trained samples/s, step {r['step_seconds']:.1f} s, learner idle "
            f"{r['learner_idle_fraction']:.2f}, engine idle {r['engine_idle_fraction']:.2f}, staleness "
            f"{r['staleness_mean']:.2f}, dropped {r['dropped_samples']}"
        )
        print(f"    reward by step: {r['reward']}")
        for process, phases in sorted(r["phases"].items()):
            print(
                f"    {process}: "
                + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]))
            )
    print(cpu_line())
    if len(results) == 2:
        ratio = results["head"]["samples_per_second"] / results["base"]["samples_per_second"]
        print(f"head / base trained samples/s: {ratio:.2f}")


if __name__ == "__main__":
    main()
