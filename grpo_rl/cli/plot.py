"""Training curves of one run or several (a sweep) as a PNG: reward, accuracy, KL and answer length per step.

    python -m grpo_rl.cli.plot outputs/2026-01-01/12-00-00 --out curves.png
    python -m grpo_rl.cli.plot multirun/2026-01-01/12-00-00 --out sweep.png --smooth 5
    python -m grpo_rl.cli.plot runs/a runs/b --out compare.png

Each argument is a run folder (with ``metrics.jsonl``) or a sweep folder (its jobs are plotted). Runs of one
sweep are labelled by the overrides that differ between them. The accuracy panel shows the held-out
``eval/accuracy`` (markers, greedy) where the run evaluated, and the training batches' ``reward_correct_mean``
(thin line) where the task has a ``correct`` component. ``--smooth N`` draws a trailing N-step moving average
over the raw curve (shown faint). matplotlib is imported lazily with the Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from grpo_rl.cli.sweep_summary import find_runs, metrics_dir, run_label, summarize_run, varying_keys
from grpo_rl.run.metrics import read_jsonl

PANELS = (
    ("reward_mean", "reward (train batch mean)"),
    ("accuracy", "accuracy"),
    ("kl_ref", "KL to reference"),
    ("response_length_mean", "answer length (tokens)"),
)


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the records that have a number for it."""
    pairs = [
        (int(r["step"]), float(r[key]))
        for r in records
        if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_runs(run_dirs: list[Path], out: str | Path, *, smooth: int = 1, title: str | None = None) -> Path:
    """Draw the curves of ``run_dirs`` into one PNG at ``out``; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = [summarize_run(d) for d in run_dirs]
    keys = varying_keys(summaries)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (run_dir, summary) in enumerate(zip(run_dirs, summaries, strict=True)):
        records = read_jsonl(metrics_dir(run_dir) / "metrics.jsonl")
        label, color = run_label(summary, keys), colors[i % len(colors)]
        for ax, (key, name) in zip(axes.flat, PANELS, strict=True):
            if key == "accuracy":
                _accuracy(ax, records, label, color, smooth)
            else:
                _curve(ax, *series(records, key), label, color, smooth)
            ax.set_title(name)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=9, frameon=False)
    fig.suptitle(title or (str(run_dirs[0]) if len(run_dirs) == 1 else f"{len(run_dirs)} runs"), fontsize=11)
    fig.tight_layout(rect=(0, 0.06 if handles else 0, 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _curve(ax, steps: list[int], values: list[float], label: str, color: str, smooth: int) -> None:
    if not steps:
        return
    if smooth > 1:
        ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
        ax.plot(steps, moving_average(values, smooth), color=color, label=label, linewidth=1.8)
    else:
        ax.plot(steps, values, color=color, label=label, linewidth=1.5, marker="." if len(steps) < 30 else None)


def _accuracy(ax, records: list[dict], label: str, color: str, smooth: int) -> None:
    steps, values = series(records, "eval/accuracy")
    if steps:
        ax.plot(steps, values, color=color, marker="o", linewidth=1.8)
    train_steps, train_values = series(records, "reward_correct_mean")
    if train_steps:
        shown = moving_average(train_values, smooth) if smooth > 1 else train_values
        ax.plot(train_steps, shown, color=color, alpha=0.45, linewidth=1, linestyle="--")
    if (steps or train_steps) and ax.get_legend() is None:
        # Colours name the runs in the figure legend; this one only says which line is which measurement.
        from matplotlib.lines import Line2D

        ax.legend(
            handles=[
                Line2D([], [], color="gray", marker="o", label="held-out, greedy (eval/accuracy)"),
                Line2D([], [], color="gray", linestyle="--", alpha=0.6, label="train batches (reward_correct_mean)"),
            ],
            fontsize=8,
            loc="best",
        )


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m grpo_rl.cli.plot", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", help="run folders or sweep folders")
    parser.add_argument("--out", default="curves.png", help="PNG to write (default: curves.png)")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window in steps (default: 1, none)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    out = plot_runs(find_runs(args.paths), args.out, smooth=max(1, args.smooth), title=args.title)
    print(out)
    return out


if __name__ == "__main__":
    main()
