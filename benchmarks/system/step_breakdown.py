"""Step-time breakdown of synchronous GRPO: generation, reference scoring, training, weight sync.

Runs ``sota/grpo.py`` as a user would (a subprocess, its defaults plus any overrides), drops the first step
(it compiles kernels and warms caches), and reports the mean of the rest from the run's ``metrics.jsonl``.
``--variant`` adds runs with extra overrides in the same invocation, so a change is measured against its
baseline on the same machine state.

    python benchmarks/system/step_breakdown.py --steps 4
    python benchmarks/system/step_breakdown.py --steps 4 --variant policy.kl_coef=0 \
        --variant train_model.precision=bfloat16

Prints the CPU with its matmul instruction sets, a table, the precision each run chose (and why), and writes
``benchmarks/results/step_breakdown.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine  # noqa: E402
from benchmarks.common.runner import run_script  # noqa: E402

COLUMNS = [
    ("step_seconds", "step s"),
    ("generation_seconds", "gen s"),
    ("reference_seconds", "ref s"),
    ("training_seconds", "train s"),
    ("weight_sync_seconds", "sync s"),
    ("answer_tokens", "tokens"),
    ("generation_tokens_per_second", "gen tok/s"),
    ("tokens_per_second", "step tok/s"),
    ("reward_mean", "reward"),
]


def run(overrides: list[str], steps: int) -> dict:
    run = run_script("grpo.py", [f"train.steps={steps}", "logger.backend=none", *overrides])
    banner = [line for line in run.output.splitlines() if line.startswith("  precision: ")]
    precision = banner[0].split(":", 1)[1].strip() if banner else "unknown"
    rows = run.rows
    timed = rows[1:] if len(rows) > 1 else rows
    mean = {key: sum(r[key] for r in timed) / len(timed) for key, _ in COLUMNS}
    return {
        "overrides": overrides,
        "precision": precision,
        "steps_timed": len(timed),
        "wall_seconds": run.seconds,
        "mean": mean,
        "per_step": rows,
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="steps per run; the first is not timed")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="space-separated overrides for an extra run measured beside the defaults",
    )
    parser.add_argument("overrides", nargs="*", help="overrides applied to every run")
    args = parser.parse_args()

    announce_machine()  # imports grpo_rl, which sets its OpenMP defaults before torch loads
    import torch

    from grpo_rl.model.precision import cpu_flags

    gpu = None
    if torch.cuda.is_available():
        gpu = f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, torch {torch.__version__}"
        print(f"GPU: {gpu}", flush=True)
    runs = [("defaults", args.overrides)] + [(v, args.overrides + v.split()) for v in args.variant]
    results = []
    for name, overrides in runs:
        print(f"running: {name}", flush=True)
        results.append({"name": name, **run(overrides, args.steps)})

    header = f"{'run':<40}" + "".join(f"{label:>12}" for _, label in COLUMNS)
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['name'][:40]:<40}" + "".join(f"{r['mean'][key]:>12.2f}" for key, _ in COLUMNS))
    for r in results:
        print(f"precision of {r['name']}: {r['precision']}")
    out = RESULTS / "step_breakdown.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": cpu_flags(), "gpu": gpu, "cores": os.cpu_count(), "runs": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
