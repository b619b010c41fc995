"""A run's report: one self-contained ``report.html`` with the curves, the roles' timeline, the logged answers token
by token and the run's events, which opens offline from the file system in any current browser.

Four parts, each from files the run already writes:

* **Curves** (``metrics.jsonl``): reward and its components, held-out evaluation, KL, entropy, clip fraction and
  engine correction, answer length, truncation, step time by phase, tokens/s, idle fractions, staleness, dropped
  samples and restarts, where the run logged them; steps that evaluated are marked. Several runs (a ``--multirun``
  sweep) are overlaid, one colour per run.
* **Timeline** (``trace.json``, or the processes' ``trace/*.jsonl`` while the run is going): the spans of a chosen
  window of steps, one lane per process and track, so overlap between generation and training shows at a glance.
* **Answers** (``samples.jsonl``): for a chosen step, each logged group's prompt and every answer with its reward
  and advantage, each token coloured by a chosen quantity (the learner-minus-engine log-prob gap, the importance
  weight, whether the engine correction's bounds cut it, its policy version where versions vary, the engine
  log-prob), with its values on hover, and tool replies as turns of their own (:mod:`grpo_rl.run.sample_log`
  writes the token data). Token data is kept for at most ``max_token_steps`` steps, spread over the run, so that a
  1,000-step run's page stays a few MB; the other steps show their answers as text.
* **Events** (``restarts.jsonl``, the log's warnings and errors: damaged checkpoints skipped, failed pushes), the
  start-up placement table and the resolved config.

Charting: the curves are inline SVG written here (:mod:`.charts`), the timeline and the tokens are drawn by about
200 lines of vanilla script from JSON embedded in the page. No charting library: a vendored one (uPlot is the
smallest serious one, ~50 KB) would add a third-party file to keep up to date and still need our own code for the
timeline and the token view; polylines and rectangles are all these charts need, SVG scales and prints cleanly,
and the page has no external resource at all (no CDN, no fonts, no server: Chromium blocks ``fetch`` on
``file://``, so everything is embedded). Sizes and open times: benchmarks/system/report_size.py.
"""

from __future__ import annotations

import html
import logging
import os
import time
from pathlib import Path
from typing import Any

from grpo_rl.run.report import charts, data
from grpo_rl.run.report.page import render
from grpo_rl.run.sample_log import last_turn

__all__ = ["build_report", "refresh_report", "write_report"]

log = logging.getLogger(__name__)

MAX_TOKEN_STEPS = 40


def _run_data(label: str, run_dir: Path, max_token_steps: int) -> dict[str, Any]:
    samples = data.samples_by_step(run_dir, max_token_steps)
    for rows in samples.values():
        for row in rows:
            row["question"] = last_turn(row.get("prompt", ""))
    return {
        "label": label,
        "dir": str(run_dir),
        "timeline": data.timeline(data.trace_events(run_dir)),
        "samples": samples,
        "events": data.events(run_dir),
        "placement": data.placement(run_dir),
        "config": data.config_text(run_dir),
    }


def _events_html(runs: list[dict[str, Any]]) -> str:
    parts = []
    for run in runs:
        if len(runs) > 1:
            parts.append(f"<h3>{html.escape(run['label'])}</h3>")
        if run["events"]:
            rows = "".join(
                f'<tr><td class="kind">{html.escape(e["kind"])}</td><td>{html.escape(e["time"])}</td>'
                f"<td>{html.escape(e['text'])}</td></tr>"
                for e in run["events"]
            )
            parts.append(f'<table class="events">{rows}</table>')
        else:
            parts.append('<p class="absent">No restarts, warnings or errors logged.</p>')
        placement = run.pop("placement") or "(no start-up log in the run folder)"
        parts.append(f"<h3>Placement</h3><pre>{html.escape(placement)}</pre>")
        config = run.pop("config") or "(no .hydra/config.yaml in the run folder)"
        parts.append(f"<details><summary>Config</summary><pre>{html.escape(config)}</pre></details>")
        run.pop("events")
    return "".join(parts)


def build_report(runs: list[tuple[str, Path]], title: str | None = None, max_token_steps: int = MAX_TOKEN_STEPS) -> str:
    """The page for ``runs`` (``(label, run folder)`` pairs; several are overlaid) as HTML text."""
    rows = [data.metric_rows(Path(d)) for _, d in runs]
    panels = charts.panel_series([(label, r) for (label, _), r in zip(runs, rows, strict=True)])
    steps = [row["step"] for r in rows for row in r]
    x_range = (min(steps, default=0), max(steps, default=1))
    eval_steps = sorted({row["step"] for row in rows[0] if "eval/accuracy" in row}) if rows else []
    labels = [label for label, _ in runs]
    panels_html = "".join(
        f'<div class="panel" data-panel="{i}"><h3>{html.escape(p["title"])}</h3>'
        + charts.svg_panel(p, len(runs), x_range, eval_steps)
        + charts.legend(p, labels)
        + "</div>"
        for i, p in enumerate(panels)
    )
    if not panels:
        panels_html = '<p class="absent">No metrics logged yet.</p>'
    run_data = [_run_data(label, Path(d), max_token_steps) for label, d in runs]
    events_html = _events_html(run_data)
    payload = {
        "runs": run_data,
        "panels": panels,
        "x": list(x_range),
        "chart": {
            "width": charts.WIDTH,
            "left": charts.LEFT,
            "pw": charts.WIDTH - charts.LEFT - charts.RIGHT,
        },
    }
    title = title or (str(runs[0][1]) if len(runs) == 1 else f"{len(runs)} runs")
    last = max(steps, default=0)
    subtitle = f"{len(runs)} run(s), up to step {last}; written {time.strftime('%Y-%m-%d %H:%M:%S')}"
    return render(title, subtitle, panels_html, events_html, payload)


def write_report(runs: list[tuple[str, Path]], out: str | Path, **options: Any) -> Path:
    """Write :func:`build_report`'s page to ``out`` whole (a temporary file, then a rename); returns ``out``."""
    out = Path(out)
    text = build_report(runs, **options)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out


def refresh_report(run_dir: str | Path) -> None:
    """Rewrite ``<run_dir>/report.html``; a failure is logged, never raised (the report is a view of the run)."""
    run_dir = Path(run_dir)
    try:
        write_report([(run_dir.name, run_dir)], run_dir / "report.html")
    except Exception as e:  # noqa: BLE001 - a report must never end the run it reports on
        log.warning("could not write %s: %s", run_dir / "report.html", e)
