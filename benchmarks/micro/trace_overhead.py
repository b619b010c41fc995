"""What a traced phase costs (``grpo_rl.trace``, on by default as ``logger.trace``): one ``trace.span`` with tracing
on, and with it off, in microseconds, the writes to the process's trace file included.

    .venv/bin/python benchmarks/micro/trace_overhead.py
    .venv/bin/python benchmarks/micro/trace_overhead.py --spans 200000 --repeats 7

A training step records about ten spans in the driver and a few per collector batch, so the cost per step is about
ten times the figure printed, against steps of seconds. On and off alternate by repeat (a change in the machine's
load hits both alike); the best and the median repeat are printed. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine  # noqa: E402
from grpo_rl import trace  # noqa: E402


def per_span_us(spans: int) -> float:
    t0 = time.perf_counter()
    for i in range(spans):
        with trace.span("train", step=i):
            pass
    trace.flush()
    return (time.perf_counter() - t0) / spans * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    announce_machine()
    on, off = [], []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            trace.start(folder, "bench")
            on.append(per_span_us(args.spans))
            trace.stop()
            off.append(per_span_us(args.spans))
        size = sum(p.stat().st_size for p in Path(folder).glob("*.jsonl")) / (args.repeats * args.spans)
    row = {
        "on_us_best": min(on),
        "on_us_median": statistics.median(on),
        "off_us_best": min(off),
        "off_us_median": statistics.median(off),
        "bytes_per_span": size,
    }
    print(f"{'':10}{'best us':>10}{'median us':>12}")
    print(f"{'on':10}{row['on_us_best']:10.2f}{row['on_us_median']:12.2f}")
    print(f"{'off':10}{row['off_us_best']:10.2f}{row['off_us_median']:12.2f}")
    print(f"{size:.0f} bytes of trace file per span")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "trace_overhead.json").write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
