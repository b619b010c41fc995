"""The report's curves: one small inline SVG line chart per panel, drawn here in Python.

A panel plots one or more metrics over steps for every run given. With one run each metric has its own colour;
with several (a sweep) each run has its colour and each metric its dash. Steps where the run evaluated are marked
in every panel: by a faint vertical line, or by a tick on the axis where there are many. The page's script adds the
hover read-out from the same series (:func:`panel_series`), so the SVG carries no per-point elements.
"""

from __future__ import annotations

import fnmatch
import html
import math
from typing import Any

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
DASHES = ("", "6 3", "2 2", "8 3 2 3", "1 3")

# (title, metric keys or fnmatch patterns). A panel none of whose keys a run logged is left out.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward (train batch mean)", ("reward_mean",)),
    ("reward components (accuracy, format rate, ...)", ("reward_*_mean",)),
    ("held-out evaluation", ("eval/accuracy", "eval/pass@*")),
    ("KL", ("kl_ref", "kl_approx", "kl_engine")),
    ("entropy", ("entropy",)),
    ("clip fraction, engine correction", ("clip_fraction", "tis_fraction", "engine_masked_fraction")),
    ("answer length (tokens)", ("response_length_mean", "response_length_max")),
    ("truncation rate", ("truncated_fraction",)),
    (
        "step time by phase (s)",
        (
            "step_seconds",
            "generation_seconds",
            "reward_seconds",
            "reference_seconds",
            "training_seconds",
            "weight_sync_seconds",
            "learner_wait_seconds",
        ),
    ),
    ("tokens / s", ("tokens_per_second", "generation_tokens_per_second", "training_tokens_per_second")),
    ("idle fraction", ("learner_idle_fraction", "engine_idle_fraction")),
    ("staleness (policy versions)", ("staleness_mean", "staleness_max")),
    ("dropped samples", ("dropped_samples",)),
    ("restarts", ("restarts/*",)),
)
SPARSE = ("eval/",)  # metrics logged on some steps only: drawn with point markers
WIDTH, HEIGHT = 380, 190
LEFT, RIGHT, TOP, BOTTOM = 46, 16, 8, 22
EVAL_LINES = 20  # up to this many evaluations get a line across the panel; more, a tick on the axis only


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def panel_series(runs: list[tuple[str, list[dict]]]) -> list[dict[str, Any]]:
    """The panels the runs have data for: ``{"title", "series": [{"run", "key", "steps", "values"}]}``."""
    panels = []
    for title, patterns in PANELS:
        series = []
        for r, (_, rows) in enumerate(runs):
            present = {k for row in rows for k in row if k != "step"}
            keys = [k for p in patterns for k in sorted(fnmatch.filter(present, p))]
            for key in dict.fromkeys(keys):
                pairs = [(row["step"], row[key]) for row in rows if _number(row.get(key))]
                if pairs:
                    steps, values = zip(*pairs, strict=True)
                    series.append({"run": r, "key": key, "steps": list(steps), "values": [_round(v) for v in values]})
        if series:
            panels.append({"title": title, "series": series})
    return panels


def _round(v: float) -> float:
    return float(f"{v:.4g}")


def nice_ticks(low: float, high: float, count: int = 4) -> list[float]:
    """About ``count`` round tick values spanning ``[low, high]``."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= 0.7 * raw)
    first = math.ceil(low / step) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step + 1e-9) + 1)]


def _label(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2g}"


def svg_panel(panel: dict[str, Any], n_runs: int, x_range: tuple[int, int], eval_steps: list[int]) -> str:
    """One panel as an SVG element (``data-panel`` is filled in by the page)."""
    x0, x1 = x_range
    values = [v for s in panel["series"] for v in s["values"]]
    y0, y1 = min(values), max(values)
    if y0 == y1:
        y0, y1 = y0 - (abs(y0) or 1) * 0.1, y1 + (abs(y1) or 1) * 0.1
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(step: float) -> float:
        return LEFT + (step - x0) / max(1, x1 - x0) * pw

    def sy(v: float) -> float:
        return TOP + (1 - (v - y0) / (y1 - y0)) * ph

    keys = list(dict.fromkeys(s["key"] for s in panel["series"]))
    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}">']
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" class="plot"/>')
    for v in nice_ticks(y0, y1):
        y = sy(v)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 4}" y="{y + 3:.1f}" class="tick" text-anchor="end">{_label(v)}</text>')
    for v in nice_ticks(x0, x1, 5):
        if v == int(v):
            x = sx(v)
            parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 6}" class="tick" text-anchor="middle">{int(v)}</text>')
    for step in eval_steps:
        x, top = sx(step), TOP if len(eval_steps) <= EVAL_LINES else TOP + ph - 5
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{TOP + ph}" class="eval"/>')
    for s in panel["series"]:
        k = keys.index(s["key"])
        color = PALETTE[(s["run"] if n_runs > 1 else k) % len(PALETTE)]
        dash = DASHES[k % len(DASHES)] if n_runs > 1 else ""
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(s["steps"], s["values"], strict=True))
        style = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<polyline points="{points}" stroke="{color}"{style} class="line"/>')
        if s["key"].startswith(SPARSE) or len(s["steps"]) < 30:
            for x, y in zip(s["steps"], s["values"], strict=True):
                parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>')
    parts.append(f'<line class="cursor" x1="0" x2="0" y1="{TOP}" y2="{TOP + ph}" visibility="hidden"/>')
    parts.append("</svg>")
    return "".join(parts)


def legend(panel: dict[str, Any], labels: list[str]) -> str:
    """The panel's key: one entry per metric (one run) or per run and metric (several)."""
    keys = list(dict.fromkeys(s["key"] for s in panel["series"]))
    entries = []
    for s in panel["series"]:
        k = keys.index(s["key"])
        n_runs = len(labels)
        color = PALETTE[(s["run"] if n_runs > 1 else k) % len(PALETTE)]
        dash = DASHES[k % len(DASHES)] if n_runs > 1 else ""
        name = s["key"] if n_runs == 1 else f"{labels[s['run']]}: {s['key']}"
        swatch = (
            f'<svg width="22" height="8"><line x1="1" x2="21" y1="4" y2="4" stroke="{color}" stroke-width="2"'
            + (f' stroke-dasharray="{dash}"' if dash else "")
            + "/></svg>"
        )
        entries.append(f"<span>{swatch}{html.escape(name)}</span>")
    return '<div class="legend">' + "".join(entries) + "</div>"
