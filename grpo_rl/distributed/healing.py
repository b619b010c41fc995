"""Replacing lost workers: the restart budget of each role, and the record of every replacement.

A collector (with its engine or served engine) or a reference replica that dies, or stops answering within
``pipeline.timeout_seconds``, is replaced by the role that owns it
(:class:`~grpo_rl.distributed.pipeline.AsyncRollouts`, :class:`~grpo_rl.distributed.reference_actors.ReferenceActors`),
up to ``pipeline.max_restarts`` times per role in a run. :class:`Restarts` is the one book they keep: it says whether
another replacement is allowed, and records each one (role, replica, cause, the seconds it cost) in the run's log, in
``restarts.jsonl`` and in the step's metrics (``restarts/<role>``, the count so far; ``restart_seconds``, the seconds
replacements cost since the last step). Past the budget the owner raises :class:`~grpo_rl.errors.RoleFailed` as before:
the run ends after a checkpoint at its last step boundary.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from grpo_rl import trace

log = logging.getLogger(__name__)


class Restarts:
    """Each role's replacements in one run, against a budget of ``max_restarts`` per role (0 ends the run at the
    first loss), appended to ``run_dir/restarts.jsonl`` when given."""

    def __init__(self, max_restarts: int, run_dir: Path | str | None = None):
        self.max_restarts = max_restarts
        self.path = Path(run_dir) / "restarts.jsonl" if run_dir is not None else None
        self.counts: dict[str, int] = {}
        self._seconds_since_report = 0.0
        self._lock = threading.Lock()  # the reference stage replaces its replicas from a thread of its own

    def register(self, role: str) -> None:
        """``role`` can be replaced: its count (0 so far) is in :meth:`metrics` from the first step."""
        with self._lock:
            self.counts.setdefault(role, 0)

    def allowed(self, role: str) -> bool:
        """May ``role`` be replaced once more?"""
        with self._lock:
            return self.counts.get(role, 0) < self.max_restarts

    def exhausted(self, role: str) -> str:
        """The end of a message that says why the run ends instead of replacing ``role``."""
        if self.max_restarts == 0:
            return "pipeline.max_restarts=0: lost workers are not replaced"
        return (
            f"after {self.counts.get(role, 0)} replacement(s), the most "
            f"pipeline.max_restarts={self.max_restarts} allows"
        )

    def record(self, role: str, replica: int, cause: str, seconds: float, **extra) -> None:
        """Count and log one replacement of ``role``'s ``replica``, which cost ``seconds``."""
        with self._lock:
            self.counts[role] = self.counts.get(role, 0) + 1
            self._seconds_since_report += seconds
            count = self.counts[role]
        who = "learner group" if role == "learner" else f"{role} replica {replica}"
        end = trace.now_us()
        trace.record(f"restart {who}", end - int(seconds * 1e6), end, track="restarts", cause=cause[:200])
        log.warning("%s replaced (%d so far) in %.1f s: %s", who, count, seconds, cause)
        if self.path is not None:
            row = {
                "time": time.time(),
                "role": role,
                "replica": replica,
                "cause": cause,
                "seconds": round(seconds, 3),
                "count": count,
                **extra,
            }
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")

    def metrics(self) -> dict[str, float]:
        """``restarts/<role>`` (the count so far) for every role replaced, and ``restart_seconds`` (what the
        replacements since the previous call cost); read once per step."""
        with self._lock:
            if not self.counts:  # nothing here can be replaced
                return {}
            out = {f"restarts/{role}": float(n) for role, n in self.counts.items()}
            out["restart_seconds"], self._seconds_since_report = self._seconds_since_report, 0.0
        return out


def died_how(error: BaseException) -> str:
    """How an actor died, from Ray's :class:`~ray.exceptions.RayActorError`: with its node, or its process alone."""
    detail = str(error).lower()
    if "node has died" in detail or "node died" in detail:
        return "its node died"
    return "its process was killed or crashed"


def record_pids(run_dir: Path | str, role: str, pids: list[int]) -> None:
    """Write ``role``'s worker process ids into ``<run_dir>/processes.json`` (one list per role, replaced as
    workers are), for a person or a test to signal."""
    path = Path(run_dir) / "processes.json"
    try:
        table = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        table = {}
    table[role] = list(pids)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table))
    tmp.replace(path)
