"""Where the time goes: every process of a run records its phases as wall-clock spans, and the run folder gets them
as one ``trace.json`` in the Chrome trace-event format, which Perfetto (https://ui.perfetto.dev, "Open trace
file") and ``chrome://tracing`` open: one process row per role worker (the driver, each collector, reference and
learner rank), one track per thread of work in it (``loop``, ``engine``, ...).

Each process appends its events to ``<run_dir>/trace/<name>.<pid>.jsonl`` (buffered, written every
:data:`FLUSH_EVENTS` events or :data:`FLUSH_SECONDS`, and at exit), so a process that is killed loses at most its
last seconds and nothing waits on another process; :func:`merge` (the driver, when the run ends) reads them all
into ``trace.json``, written whole by rename. A resumed run's trace holds the earlier attempt's spans too: the
per-process files stay until the run folder is removed.

A span costs about 10 us, its share of the file writes included (``benchmarks/micro/trace_overhead.py``: 10.1 us
on, 1.9 us off, 97 bytes, on a 2-core AMD EPYC); a step records about ten against seconds of work, so tracing is
on by default (``logger.trace``). Timestamps are wall-clock microseconds (``time.time_ns``),
comparable across the processes of one machine; across machines they are as good as the clocks' agreement.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

FLUSH_EVENTS = 512
FLUSH_SECONDS = 5.0


class _Recorder:
    def __init__(self, folder: Path, name: str):
        self.folder, self.name, self.pid = folder, name, os.getpid()
        self.path = folder / f"{name.replace(' ', '_')}.{self.pid}.jsonl"
        self._events: list[dict] = []
        self._tracks: dict[str, int] = {}
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        self._add({"ph": "M", "name": "process_name", "pid": self.pid, "args": {"name": name}})

    def tid(self, track: str) -> int:
        tid = self._tracks.get(track)
        if tid is None:
            tid = self._tracks[track] = len(self._tracks) + 1
            self._add({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid, "args": {"name": track}})
        return tid

    def complete(self, name: str, track: str, start_us: int, end_us: int, args: dict) -> None:
        event = {"ph": "X", "name": name, "pid": self.pid, "tid": self.tid(track), "ts": start_us}
        event["dur"] = max(0, end_us - start_us)
        if args:
            event["args"] = args
        self._add(event)

    def _add(self, event: dict) -> None:
        with self._lock:
            self._events.append(event)
            due = len(self._events) >= FLUSH_EVENTS or time.monotonic() - self._last_flush > FLUSH_SECONDS
        if due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            self._last_flush = time.monotonic()
        if not events:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
        except OSError:  # a full or removed run folder: the trace is a diagnostic, never a reason to fail
            pass


_recorder: _Recorder | None = None


def start(folder: str | os.PathLike, name: str) -> None:
    """Record this process's spans into ``folder`` under ``name`` (the process row's label) from now on."""
    global _recorder
    if _recorder is not None and _recorder.pid == os.getpid():
        _recorder.flush()
    _recorder = _Recorder(Path(folder), name)
    atexit.register(_recorder.flush)


def stop() -> None:
    """Write what is buffered and record nothing more in this process."""
    global _recorder
    if _recorder is not None:
        _recorder.flush()
    _recorder = None


def enabled() -> bool:
    return _recorder is not None and _recorder.pid == os.getpid()  # a forked child records nothing of its own


def now_us() -> int:
    return time.time_ns() // 1000


@contextlib.contextmanager
def span(name: str, track: str = "loop", **args) -> Iterator[None]:
    """Record the block as a span ``name`` on ``track`` of this process (nothing when tracing is off)."""
    if not enabled():
        yield
        return
    t0 = now_us()
    try:
        yield
    finally:
        if _recorder is not None:
            _recorder.complete(name, track, t0, now_us(), args)


def record(name: str, start_us: int, end_us: int, track: str = "loop", **args) -> None:
    """Record a span measured elsewhere (from :func:`now_us` readings)."""
    if enabled():
        _recorder.complete(name, track, start_us, end_us, args)


def flush() -> None:
    if enabled():
        _recorder.flush()


def merge(folder: str | os.PathLike, out: str | os.PathLike) -> int:
    """Read every process's events under ``folder`` into ``out`` (``{"traceEvents": [...]}``, written whole by
    rename); the number of events. A line cut short by a killed process is skipped."""
    folder, out = Path(folder), Path(out)
    events: list[dict] = []
    for path in sorted(folder.glob("*.jsonl")):
        with open(path) as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    events.append(json.loads(line))
    spans = sorted((e for e in events if e.get("ph") != "M"), key=lambda e: e["ts"])
    meta = [e for e in events if e.get("ph") == "M"]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        f.write(",\n".join(json.dumps(e, separators=(",", ":")) for e in itertools.chain(meta, spans)))
        f.write("\n]}\n")
    os.replace(tmp, out)
    return len(spans)
