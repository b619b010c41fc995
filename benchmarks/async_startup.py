"""Start-up of the asynchronous loop: seconds from the run's start to its first step, this tree against a baseline
commit, runs alternated.

    python benchmarks/async_startup.py --baseline f7e4310 --repeats 3      # a tiny random model, 1 step per run

Each run is ``sota/grpo-async.py`` for one step on a tiny random model (so the time is the roles' start: Ray, the
collector actor with its vLLM engine, the reference actor, the learner in the driver, the first weights), read from
the run's own log line ``step 1/1 started ... (N s since start)``. The baseline runs from a ``git worktree`` of the
given commit, with this environment's packages, first on ``PYTHONPATH``. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_rl.model.precision import cpu_flags  # noqa: E402


def cpu_banner() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"CPU: {cpu_flags()}, {os.cpu_count()} cores, load average {load}"

SINCE_START = re.compile(r"step 1/1 started.*\((\d+) s since start\)")


def run_once(tree: Path, model_dir: Path, out_dir: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    overrides = [f"model.name={model_dir}", f"output_dir={out_dir}", "train.steps=1", "logger.backend=none",
                 "sampling.max_new_tokens=16", "env.prompts_per_step=2", "env.group_size=4", "eval.every=0",
                 "inference_model.kv_cache_gb=1", "inference_model.max_model_len=512"]
    proc = subprocess.run([sys.executable, str(tree / "sota" / "grpo-async.py"), *overrides], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=900)
    found = SINCE_START.search(proc.stdout + proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"{tree}: the run failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="git commit to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "async_startup.json"))
    args = parser.parse_args()
    print(cpu_banner(), flush=True)
    from grpo_rl.model.loading import build_tiny_model, resolve_model

    with tempfile.TemporaryDirectory(prefix="grpo_startup_") as tmp:
        tmp = Path(tmp)
        model = build_tiny_model(resolve_model("embedded:smollm2-135m-instruct"), tmp / "tiny")
        baseline = tmp / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(baseline), args.baseline],
                       check=True, capture_output=True)
        times: dict[str, list[float]] = {"baseline": [], "this tree": []}
        try:
            for i in range(args.repeats):
                for name, tree in (("baseline", baseline), ("this tree", ROOT)):
                    seconds = run_once(tree, model, tmp / f"run_{name.replace(' ', '_')}_{i}")
                    times[name].append(seconds)
                    print(f"  {name:10s} run {i + 1}: first step {seconds:.0f} s after the start", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)],
                           capture_output=True)
    print(f"\n{'tree':12s} {'median s':>9s}  runs")
    for name, values in times.items():
        print(f"{name:12s} {statistics.median(values):9.0f}  {', '.join(f'{v:.0f}' for v in values)}")
    ratio = statistics.median(times["this tree"]) / statistics.median(times["baseline"])
    print(f"this tree / baseline: {ratio:.2f}; {cpu_banner()}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"cpu": cpu_banner(), "baseline": args.baseline, "seconds": times,
                                           "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
