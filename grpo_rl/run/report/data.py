"""What a report shows of one run folder, read from its files into plain, compact JSON-able values.

Each reader takes the run folder and tolerates a missing or half-written file (a report refreshed during the run,
an older run's folder): what is not there is shown as absent, never invented.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

from grpo_rl.run.metrics import read_jsonl

# A logged warning or error that is a run event, by what its message says.
EVENT_KINDS = (
    ("damaged checkpoint", re.compile(r"damaged|corrupt", re.I)),
    ("push failed", re.compile(r"push|weight sync|weights? (?:to|delivery)", re.I)),
    ("restart", re.compile(r"replaced|started again|restart", re.I)),
)
_LOG_RECORD = re.compile(r"^\[(?P<time>[^\]]+)\]\[(?P<logger>[^\]]+)\]\[(?P<level>[A-Z]+)\] - (?P<message>.*)$")


def metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl``'s rows in step order (the last row of a step logged twice wins)."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        if isinstance(row.get("step"), int):
            by_step[row["step"]] = row
    return [by_step[s] for s in sorted(by_step)]


def samples_by_step(run_dir: Path, max_token_steps: int) -> dict[int, list[dict[str, Any]]]:
    """``samples.jsonl``'s rows by step; the token-by-token ``answers`` are kept for at most ``max_token_steps``
    steps, spread evenly over those that have them and always the last (the page's size stays bounded)."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in read_jsonl(run_dir / "samples.jsonl"):
        by_step.setdefault(int(row["step"]), []).append(row)
    detailed = [s for s, rows in by_step.items() if any("answers" in r for r in rows)]
    keep = set(spread(sorted(detailed), max_token_steps))
    for step, rows in by_step.items():
        if step not in keep:
            for row in rows:
                row.pop("answers", None)
    return dict(sorted(by_step.items()))


def spread(items: list, k: int) -> list:
    """Up to ``k`` of ``items``, evenly spaced, the first and the last included."""
    if k <= 0:
        return []
    if len(items) <= k:
        return list(items)
    if k == 1:
        return [items[-1]]
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def trace_events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's trace events: ``trace.json`` once the run has merged it, else its processes' files so far."""
    merged = run_dir / "trace.json"
    if merged.exists():
        with contextlib.suppress(OSError, ValueError):
            return json.loads(merged.read_text())["traceEvents"]
    events: list[dict[str, Any]] = []
    for path in sorted((run_dir / "trace").glob("*.jsonl")):
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    events.append(json.loads(line))
    return events


def timeline(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Spans as ``[lane, name, start_ms, duration_ms, step]`` (times from the first span; ``step`` -1 where the
    span does not say), lanes as ``process / track`` in process order, and each step's start (``[step, ms]``)."""
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    tracks = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    spans = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])
    if not spans:
        return {"lanes": [], "names": [], "spans": [], "steps": []}
    t0 = spans[0]["ts"]
    order = sorted({(e["pid"], e["tid"]) for e in spans}, key=lambda k: (k[0] != spans[0]["pid"], k))
    lanes = {k: i for i, k in enumerate(order)}
    names: dict[str, int] = {}
    out, starts = [], {}
    for e in spans:
        step = e.get("args", {}).get("step", -1)
        name = names.setdefault(e["name"], len(names))
        start = round((e["ts"] - t0) / 1000, 2)
        out.append([lanes[(e["pid"], e["tid"])], name, start, round(e.get("dur", 0) / 1000, 2), step])
        if e["name"] == "wait for batch" and isinstance(step, int):
            starts.setdefault(step, start)
    return {
        "lanes": [f"{processes.get(pid, pid)} / {tracks.get((pid, tid), tid)}" for pid, tid in order],
        "names": list(names),
        "spans": out,
        "steps": sorted([s, t] for s, t in starts.items()),
    }


def log_file(run_dir: Path) -> Path | None:
    """The run's log (``<job name>.log``, written by Hydra), if any."""
    logs = sorted(run_dir.glob("*.log"))
    return logs[0] if logs else None


def events(run_dir: Path) -> list[dict[str, Any]]:
    """Restarts (``restarts.jsonl``) and the log's warnings and errors, each with its ``kind``, in time order
    (local time, as the log writes it)."""
    out: list[dict[str, Any]] = []
    for row in read_jsonl(run_dir / "restarts.jsonl"):
        who = "learner group" if row.get("role") == "learner" else f"{row.get('role')} replica {row.get('replica')}"
        detail = f"{who} replaced in {row.get('seconds')} s: {row.get('cause')}"
        if row.get("step") is not None:
            detail += f" (continued from step {row['step']})"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["time"])) if "time" in row else ""
        out.append({"kind": "restart", "time": when, "text": detail})
    path = log_file(run_dir)
    if path is not None:
        for line in path.read_text(errors="replace").splitlines():
            m = _LOG_RECORD.match(line)
            if m and m["level"] in ("WARNING", "ERROR", "CRITICAL"):
                kind = next((k for k, pattern in EVENT_KINDS if pattern.search(m["message"])), m["level"].lower())
                out.append({"kind": kind, "time": m["time"], "text": m["message"]})
    return sorted(out, key=lambda e: e["time"])


def placement(run_dir: Path) -> str:
    """The start-up banner of the run's log (what runs where: devices, roles, threads, precision), or ``""``."""
    path = log_file(run_dir)
    if path is None:
        return ""
    lines = path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        m = _LOG_RECORD.match(line)
        if m and m["logger"] == "grpo_rl.run.setup":
            block = [m["message"]]
            for more in lines[i + 1 :]:
                if not more.startswith("  "):
                    break
                block.append(more)
            return "\n".join(block)
    return ""


def config_text(run_dir: Path) -> str:
    """The run's config: Hydra's ``.hydra/config.yaml``, else the newest checkpoint's ``config.yaml``, else ``""``."""
    paths = [run_dir / ".hydra" / "config.yaml", *sorted(run_dir.glob("checkpoints/*/config.yaml"), reverse=True)]
    return next((p.read_text() for p in paths if p.exists()), "")
