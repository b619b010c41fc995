"""The embedded default with tools for a fixed time: tool-call rate, tool errors and reward at the start and the end.

    .venv/bin/python benchmarks/learning/tools_run.py --minutes 15   # grpo_gsm8k_tools (GSM8K + calculator)
    .venv/bin/python benchmarks/learning/tools_run.py --config grpo_arithmetic_tools --minutes 15

Runs ``sota/grpo.py --config-name <config>`` with ``train.max_time_minutes`` (the time counts from the run's start,
engine start-up included) and no evaluation, then reads its ``metrics.jsonl``: per step the tool-call rate (the
share of episodes that called a tool), tool calls and turns per episode, tool errors, the reward and its
components. Prints the first and last ``--window`` steps' means and a per-step table, the CPU flags and the load
average at the start and the end, and writes JSON (default ``benchmarks/results/tools_run_<config>.json``).
Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine  # noqa: E402
from benchmarks.common.runner import run_script  # noqa: E402

KEYS = (
    "tool_call_rate",
    "tool_calls_mean",
    "turns_mean",
    "tool_errors",
    "reward_mean",
    "reward_correct_mean",
    "reward_format_mean",
    "response_length_mean",
    "step_seconds",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="grpo_gsm8k_tools")
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--window", type=int, default=3, help="steps averaged at the start and at the end")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = parser.parse_args()
    out = args.out or RESULTS / f"tools_run_{args.config}.json"

    from grpo_rl.model.precision import cpu_flags

    run_dir = Path(tempfile.mkdtemp(prefix="tools-run-")) / "run"
    load_start = os.getloadavg()
    announce_machine()
    print(f"{args.config} for {args.minutes:g} min; run folder {run_dir}", flush=True)
    run = run_script(
        "grpo.py",
        [
            "--config-name",
            args.config,
            f"train.max_time_minutes={args.minutes}",
            "train.steps=100000",
            "eval.every=0",
            "logger.backend=none",
            *args.overrides,
        ],
        run_dir=run_dir,
        log=run_dir.parent / "train.log",
    )
    rows, wall = run.rows, run.seconds
    if len(rows) < 2 * args.window:
        sys.exit(f"only {len(rows)} steps in {args.minutes:g} min: too few for two windows of {args.window}")
    mean = lambda rs, k: sum(r.get(k, 0.0) for r in rs) / len(rs)  # noqa: E731
    first, last = rows[: args.window], rows[-args.window :]
    load_end = os.getloadavg()
    result = {
        "config": args.config,
        "overrides": args.overrides,
        "minutes": args.minutes,
        "cpu": cpu_flags(),
        "cores": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "steps": len(rows),
        "wall_seconds": wall,
        "window": args.window,
        "first": {k: mean(first, k) for k in KEYS},
        "last": {k: mean(last, k) for k in KEYS},
        "per_step": [{"step": r["step"], **{k: r.get(k) for k in KEYS}} for r in rows],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    print(
        f"\n{args.config}: {len(rows)} steps in {wall / 60:.1f} min; load average start "
        f"{' '.join(f'{x:.2f}' for x in load_start)}, end {' '.join(f'{x:.2f}' for x in load_end)}"
    )
    print(f"| steps | {' | '.join(KEYS)} |")
    print("|---|" + "---|" * len(KEYS))
    for name, window in ((f"first {args.window}", first), (f"last {args.window}", last)):
        print(f"| {name} | " + " | ".join(f"{mean(window, k):.3f}" for k in KEYS) + " |")
    print("\nper step:")
    for r in rows:
        print(f"  {r['step']:>3} " + " ".join(f"{k}={r.get(k, float('nan')):.3f}" for k in KEYS))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
