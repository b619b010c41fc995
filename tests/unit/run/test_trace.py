"""grpo_rl.trace: spans in the Chrome trace-event format, one file per process, merged into trace.json."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

from grpo_rl import trace


def _child(folder: str) -> None:
    trace.start(folder, "collector 0")
    with trace.span("generate", track="engine", batch=3):
        time.sleep(0.01)
    trace.flush()
    with trace.span("reward", track="rollout", batch=3):
        pass
    os._exit(0)  # killed without cleanup: what it flushed is all there is


def test_spans_of_two_processes_merge_into_one_trace(tmp_path):
    folder = tmp_path / "trace"
    trace.start(folder, "driver")
    try:
        with trace.span("wait for batch", step=1):
            proc = multiprocessing.get_context("fork").Process(target=_child, args=(str(folder),))
            proc.start()
            proc.join(60)
        with trace.span("train", rows=8):
            pass
        end = trace.now_us()
        trace.record("restart collector replica 0", end - 2_000_000, end, track="restarts")
    finally:
        trace.stop()
    assert proc.exitcode == 0
    assert trace.merge(folder, tmp_path / "trace.json") == 4  # the child's unflushed "reward" is lost
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    rows = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert rows == {os.getpid(): "driver", proc.pid: "collector 0"}
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]  # in time order
    assert [(e["name"], rows[e["pid"]], tracks[e["pid"], e["tid"]]) for e in spans] == [
        ("restart collector replica 0", "driver", "restarts"),  # started 2 s before it was recorded
        ("wait for batch", "driver", "loop"),
        ("generate", "collector 0", "engine"),
        ("train", "driver", "loop"),
    ]
    wait, generate = spans[1], spans[2]
    assert wait["ts"] <= generate["ts"] and generate["ts"] + generate["dur"] <= wait["ts"] + wait["dur"]
    assert generate["dur"] >= 10_000 and generate["args"] == {"batch": 3} and wait["args"] == {"step": 1}


def test_nothing_is_recorded_when_tracing_is_off(tmp_path):
    trace.stop()
    with trace.span("train"):
        pass
    trace.record("push", 0, 1)
    assert not trace.enabled() and not (tmp_path / "trace").exists()
