"""One table across the jobs of a sweep: what each job changed, and how it ended.

    python sota/grpo.py --multirun optimizer.lr=1e-4,1e-5 policy.kl_coef=0,0.01
    python -m grpo_rl.cli.sweep_summary multirun/2026-01-01/12-00-00
    python -m grpo_rl.cli.sweep_summary multirun/2026-01-01/12-00-00 --sort reward --json

A job is a sub-folder with Hydra's ``.hydra/overrides.yaml`` and a ``metrics.jsonl`` (in the job folder, or
under ``output_dir/<job number>`` when the sweep set ``output_dir``). The overrides that differ between jobs
become columns; those shared by every job are printed once above the table. Run folders that are not Hydra jobs
(``outputs/DATE/TIME``, or any folder with a ``metrics.jsonl``) can be listed too.

Columns: ``reward`` is the mean training reward over the last ``min(5, steps // 3)`` steps (at least one), as in
the run's closing summary; ``accuracy`` is the last ``eval/accuracy`` (held-out, greedy) when the run evaluated,
and ``train_acc`` the training batches' ``reward_correct_mean`` over the same last steps.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grpo_rl.run.metrics import read_jsonl


@dataclass
class RunSummary:
    """How one run (a sweep job) ended."""

    name: str
    path: str
    overrides: dict[str, str] = field(default_factory=dict)
    steps: int = 0
    reward: float = math.nan
    accuracy: float = math.nan
    pass_at_k: float = math.nan
    train_acc: float = math.nan
    finished: bool = False


def _overrides(job_dir: Path) -> dict[str, str]:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return {}
    from omegaconf import OmegaConf

    out = {}
    for item in OmegaConf.to_container(OmegaConf.load(path)) or []:
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def metrics_dir(job_dir: Path) -> Path:
    """Where a job wrote its metrics: the job folder, or ``output_dir/<job number>`` if the sweep set ``output_dir``."""
    if (job_dir / "metrics.jsonl").exists():
        return job_dir
    config = job_dir / ".hydra" / "config.yaml"
    if config.exists():
        from omegaconf import OmegaConf

        output_dir = OmegaConf.load(config).get("output_dir")
        if output_dir:
            for candidate in (Path(output_dir) / job_dir.name, Path(output_dir)):
                if (candidate / "metrics.jsonl").exists():
                    return candidate
    return job_dir


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run folders among ``paths``: each path itself if it is a run, else its job sub-folders (numeric order)."""
    runs: list[Path] = []
    for path in map(Path, paths):
        if (path / "metrics.jsonl").exists() or (path / ".hydra" / "overrides.yaml").exists():
            runs.append(path)
            continue
        jobs = [
            p
            for p in path.iterdir()
            if p.is_dir() and ((p / "metrics.jsonl").exists() or (p / ".hydra" / "overrides.yaml").exists())
        ]
        if not jobs:
            raise FileNotFoundError(
                f"{path}: no metrics.jsonl here or in its sub-folders; is it a run or sweep folder?"
            )
        runs.extend(sorted(jobs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name)))
    return runs


def _last_mean(records: list[dict], key: str, k: int) -> float:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return sum(values[-k:]) / len(values[-k:]) if values else math.nan


def summarize_run(run_dir: Path) -> RunSummary:
    data_dir = metrics_dir(run_dir)
    records = [r for r in read_jsonl(data_dir / "metrics.jsonl") if "reward_mean" in r]
    summary = RunSummary(
        name=run_dir.name,
        path=str(data_dir),
        overrides=_overrides(run_dir),
        finished=(data_dir / "final_model" / "config.json").exists(),
    )
    if not records:
        return summary
    k = max(1, min(5, len(records) // 3))
    summary.steps = int(records[-1]["step"])
    summary.reward = _last_mean(records, "reward_mean", k)
    summary.train_acc = _last_mean(records, "reward_correct_mean", k)
    evals = [r for r in records if "eval/accuracy" in r]
    if evals:
        summary.accuracy = float(evals[-1]["eval/accuracy"])
        pass_keys = [key for key in evals[-1] if key.startswith("eval/pass@")]
        if pass_keys:
            summary.pass_at_k = float(evals[-1][pass_keys[0]])
    return summary


def varying_keys(runs: list[RunSummary]) -> list[str]:
    """Override keys whose value is not the same in every run (in first-seen order)."""
    keys: list[str] = []
    for run in runs:
        keys.extend(k for k in run.overrides if k not in keys)
    return [k for k in keys if len({run.overrides.get(k) for run in runs}) > 1]


def run_label(run: RunSummary, keys: list[str]) -> str:
    """A short legend label: the run's values of the varying overrides, else its folder name."""
    parts = [f"{k}={run.overrides[k]}" for k in keys if k in run.overrides]
    return " ".join(parts) if parts else run.name


def format_table(runs: list[RunSummary]) -> str:
    keys = varying_keys(runs)
    common = {k: v for k, v in (runs[0].overrides.items() if runs else []) if k not in keys}
    header = ["job", *keys, "steps", "reward", "accuracy", "pass@k", "train_acc", "done"]
    rows = [
        [
            run.name,
            *[run.overrides.get(k, "") for k in keys],
            str(run.steps),
            _fmt(run.reward),
            _fmt(run.accuracy),
            _fmt(run.pass_at_k),
            _fmt(run.train_acc),
            "yes" if run.finished else "no",
        ]
        for run in runs
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    if common:
        lines.append("common overrides: " + " ".join(f"{k}={v}" for k, v in common.items()))
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.4f}"


def main(argv: list[str] | None = None) -> list[RunSummary]:
    parser = argparse.ArgumentParser(prog="python -m grpo_rl.cli.sweep_summary", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", help="sweep folders (multirun/DATE/TIME) or run folders")
    parser.add_argument(
        "--sort",
        choices=("job", "reward", "accuracy", "steps"),
        default="job",
        help="order of the rows (best first for reward and accuracy)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per job instead of a table")
    args = parser.parse_args(argv)
    runs = [summarize_run(p) for p in find_runs(args.paths)]
    if args.sort != "job":
        runs.sort(key=lambda r: -math.inf if math.isnan(getattr(r, args.sort)) else getattr(r, args.sort), reverse=True)
    if args.json:
        # NaN (not measured) is written as null: strict JSON has no NaN.
        print(
            "\n".join(
                json.dumps({k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(r).items()})
                for r in runs
            )
        )
    else:
        print(format_table(runs))
    return runs


if __name__ == "__main__":
    main()
