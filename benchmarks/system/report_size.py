"""The run report of a long run (``grpo_rl.run.report``): its size, the time to write it and the time headless
Chromium takes to open it, for a synthetic 1,000-step run folder shaped like the GSM8K default's.

    .venv/bin/python benchmarks/system/report_size.py
    .venv/bin/python benchmarks/system/report_size.py --steps 1000 --group-size 8 --tokens 128 --repeats 3

The folder holds what a run writes: ``metrics.jsonl`` (60 metrics a step, an evaluation every 10 steps),
``samples.jsonl`` (2 groups of ``--group-size`` answers of ``--tokens`` tokens, token by token, every 5 steps),
``trace.json`` (a driver and two collectors, 12 spans a step) and a log. The open time is Chromium's wall time to
load the page, run its script and dump the DOM, against the same for an empty page in the same run (Chromium's
own start-up); it is printed when ``chromium`` is on the PATH. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine  # noqa: E402
from grpo_rl.run.report import write_report  # noqa: E402

WORDS = ("the", " answer", " is", " 42", ".", "\n", " so", " we", " add", " 3", " and", " 5", "####", " total")


def synthetic_run(run_dir: Path, steps: int, group_size: int, tokens: int, seed: int = 0) -> None:
    """A run folder of ``steps`` steps, shaped like the GSM8K default's logs."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True)
    keys = [f"metric_{i}" for i in range(40)]
    with open(run_dir / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            row = {"step": s, "reward_mean": 1 - math.exp(-s / 300) + rng.gauss(0, 0.05), "kl_ref": s * 1e-5}
            row |= {"reward_correct_mean": row["reward_mean"] * 0.8, "reward_format_mean": min(1.0, s / 200)}
            row |= {"entropy": 1.5, "clip_fraction": 0.01, "response_length_mean": 120.0, "truncated_fraction": 0.1}
            row |= {"generation_seconds": 5.0, "training_seconds": 3.0, "step_seconds": 8.5, "tokens_per_second": 300}
            row |= {k: rng.random() for k in keys}
            if s % 10 == 0:
                row |= {"eval/accuracy": row["reward_mean"], "eval/pass@4": row["reward_mean"] + 0.1}
            f.write(json.dumps(row) + "\n")
    with open(run_dir / "samples.jsonl", "w") as f:
        for s in [1, *range(5, steps + 1, 5)]:
            for g in range(2):
                answers = []
                for _ in range(group_size):
                    toks = [rng.choice(WORDS) for _ in range(tokens)]
                    lp = [round(-rng.expovariate(1.0), 3) for _ in toks]
                    answer = {"response": "".join(toks), "reward": 1.0, "reward_correct": 1.0, "advantage": 0.3536}
                    answer |= {"truncated": False, "tokens": toks, "logprob": lp}
                    answer |= {"learner_logprob": [round(v + rng.gauss(0, 0.02), 3) for v in lp]}
                    answer |= {"engine_outside": [], "policy_version": s - 1}
                    answers.append(answer)
                row = {"step": s, "prompt": f"<|im_start|>user\nQuestion {s}.{g}?<|im_end|>", "response": "x"}
                row |= {"reward": 1.0, "group": g, "reference": "42", "advantage": 0.35, "answers": answers}
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
    events: list[dict] = []
    for pid, name in ((1, "driver"), (2, "collector 0"), (3, "collector 1")):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "loop"}})
    t = 0
    for s in range(1, steps + 1):
        for name, pid, dur in (("wait for batch", 1, 1e5), ("reference", 1, 1e6), ("train", 1, 3e6), ("push", 1, 2e5)):
            args = {"args": {"step": s}} if name == "wait for batch" else {}
            events.append({"ph": "X", "name": name, "pid": pid, "tid": 1, "ts": t, "dur": int(dur)} | args)
            t += int(dur)
        for pid in (2, 3):
            for b in range(4):
                events.append(
                    {"ph": "X", "name": "generate", "pid": pid, "tid": 1, "ts": t - 4_000_000 + b * 1_000_000}
                )
                events[-1] |= {"dur": 900_000, "args": {"batch": 4 * s + b}}
    (run_dir / "trace.json").write_text(json.dumps({"displayTimeUnit": "ms", "traceEvents": events}))
    (run_dir / "grpo.log").write_text("[2026-01-01 00:00:00,000][grpo_rl.run.setup][INFO] - GRPO (synthetic)\n")


def open_seconds(chromium: str, page: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--dump-dom", page.resolve().as_uri()],
        capture_output=True,
        check=True,
        timeout=300,
    )
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    announce_machine()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder) / "run"
        synthetic_run(run, args.steps, args.group_size, args.tokens)
        logs = sum(p.stat().st_size for p in run.iterdir() if p.is_file())
        write_seconds = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            page = write_report([("run", run)], run / "report.html")
            write_seconds.append(time.perf_counter() - t0)
        row = {
            "steps": args.steps,
            "logs_mb": logs / 1e6,
            "report_mb": page.stat().st_size / 1e6,
            "write_seconds_median": statistics.median(write_seconds),
        }
        if chromium is not None:
            empty = Path(folder) / "empty.html"
            empty.write_text("<!DOCTYPE html><html><body></body></html>")
            opened, baseline = [], []
            for _ in range(args.repeats):  # alternated: a change in the machine's load hits both alike
                baseline.append(open_seconds(chromium, empty))
                opened.append(open_seconds(chromium, page))
            row |= {"open_seconds_median": statistics.median(opened), "empty_page_seconds": statistics.median(baseline)}
    print(f"{'steps':>6}{'logs MB':>10}{'report MB':>11}{'write s':>9}{'open s':>9}{'empty page s':>14}")
    print(
        f"{row['steps']:6d}{row['logs_mb']:10.1f}{row['report_mb']:11.2f}{row['write_seconds_median']:9.2f}"
        + (f"{row['open_seconds_median']:9.2f}{row['empty_page_seconds']:14.2f}" if chromium else "  (no chromium)")
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "report_size.json").write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
