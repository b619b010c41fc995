"""Does GRPO visibly teach the embedded model arithmetic on a CPU? Held-out accuracy before and after a timed run.

    .venv/bin/python benchmarks/learning/arithmetic_learning.py --minutes 30          # single-turn, 200 problems
    .venv/bin/python benchmarks/learning/arithmetic_learning.py --minutes 30 --tools  # with the calculator
    .venv/bin/python benchmarks/learning/arithmetic_learning.py --minutes 1 optimizer.lr=5e-5   # overrides: every phase

Three phases, each its own process, on an otherwise idle machine:

1. the base model (``model.name`` of the config, the embedded SmolLM2-135M-Instruct) evaluated on the first
   ``--eval-prompts`` held-out problems with ``python -m grpo_rl.cli.evaluate``;
2. ``sota/grpo.py --config-name grpo_arithmetic`` (``grpo_arithmetic_tools`` with ``--tools``) for ``--minutes``
   (``train.max_time_minutes``; the time counts from the run's start, engine start-up included), without
   evaluations during training;
3. the run's ``final_model`` evaluated exactly as the base model: the same command, config and overrides
   (greedy answers, success = the ``correct`` reward component).

Prints greedy accuracy before and after with 95% Wilson intervals, the steps done, the wall times, the CPU
(``grpo_rl.model.precision.cpu_flags``) and the load average at the start and the end (others' work on the machine slows
the run and so lowers the steps done in the time), and writes them to ``--out`` (default
``benchmarks/results/arithmetic_learning[_tools].json``). The work folder (run, logs) is removed unless ``--keep``
or a phase failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS, ROOT  # noqa: E402
from benchmarks.common.machine import announce_machine  # noqa: E402
from benchmarks.common.runner import run_script, script_env  # noqa: E402
from benchmarks.common.stats import wilson  # noqa: E402


def run_logged(cmd: list[str], log_path: Path, what: str) -> float:
    """Run ``cmd`` (an evaluation, in the training run's environment) with its output in ``log_path``; returns the
    wall seconds; exits with the log's tail on failure."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=script_env(), stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - t0
    if rc != 0:
        tail = log_path.read_text().splitlines()[-30:]
        sys.exit(f"{what} failed (exit {rc}); the end of {log_path}:\n" + "\n".join(tail))
    return seconds


def base_model_folder(model_name: str, out: Path) -> Path:
    """A folder of links to the base model's files, so the evaluation's ``eval_results.json`` lands in ``out``
    rather than in the model cache."""
    from grpo_rl.model.loading import resolve_model

    source = Path(resolve_model(model_name))
    out.mkdir(parents=True)
    for f in source.iterdir():
        if f.name != "eval_results.json":
            (out / f.name).symlink_to(f.resolve())
    return out


def evaluate(model_dir: Path, config_name: str, overrides: list[str], log_path: Path, what: str) -> dict:
    """``python -m grpo_rl.cli.evaluate`` on ``model_dir``; its ``eval_results.json`` plus the wall seconds."""
    seconds = run_logged(
        [
            sys.executable,
            "-m",
            "grpo_rl.rollout.evaluation",
            f"checkpoint={model_dir}",
            "--config-name",
            config_name,
            *overrides,
        ],
        log_path,
        what,
    )
    result = json.loads((model_dir / "eval_results.json").read_text())
    n = int(result["eval/num_prompts"])
    correct = round(result["eval/accuracy"] * n)
    return {
        "accuracy": result["eval/accuracy"],
        "correct": correct,
        "prompts": n,
        "wilson95": list(wilson(correct, n)),
        "format_mean": result.get("eval/reward_format_mean"),
        "response_tokens_mean": result["eval/response_length_mean"],
        "wall_seconds": seconds,
        "eval_seconds": result["eval/seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="training time (train.max_time_minutes)")
    parser.add_argument("--eval-prompts", type=int, default=200, help="held-out problems evaluated before and after")
    parser.add_argument("--tools", action="store_true", help="config grpo_arithmetic_tools (the calculator)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the run folder (checkpoints, final model, logs)")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) for every phase")
    args = parser.parse_args()
    config_name = "grpo_arithmetic_tools" if args.tools else "grpo_arithmetic"
    out = args.out or RESULTS / f"arithmetic_learning{'_tools' if args.tools else ''}.json"

    announce_machine()
    from grpo_rl.api import compose
    from grpo_rl.model.precision import cpu_flags

    # The evaluation's settings, identical before and after; the test split must hold the problems evaluated.
    eval_overrides = [f"eval.num_prompts={args.eval_prompts}", "eval.pass_k=0", *args.overrides]
    cfg = compose(config_name, eval_overrides)
    if cfg.env.arithmetic.test_size < args.eval_prompts:
        eval_overrides.insert(1, f"env.arithmetic.test_size={args.eval_prompts}")
    train_overrides = [
        f"train.max_time_minutes={args.minutes}",
        "train.steps=100000",
        "eval.every=0",
        "logger.backend=none",
        *eval_overrides,
    ]

    work = Path(tempfile.mkdtemp(prefix="arithmetic-learning-"))
    started, load_start = time.time(), os.getloadavg()
    print(
        f"config {config_name}, {args.minutes:g} min, {args.eval_prompts} held-out problems; work folder {work}",
        flush=True,
    )
    finished = False
    try:
        before = evaluate(
            base_model_folder(cfg.model.name, work / "base_model"),
            config_name,
            eval_overrides,
            work / "eval_before.log",
            "evaluate the base model",
        )
        print(f"  before: accuracy {before['accuracy']:.3f}", flush=True)
        run_dir = work / "run"
        print(
            f"[{time.strftime('%H:%M:%S')}] train for {args.minutes:g} min: sota/grpo.py --config-name {config_name} "
            f"{' '.join(train_overrides)}",
            flush=True,
        )
        run = run_script(
            "grpo.py", ["--config-name", config_name, *train_overrides], run_dir=run_dir, log=work / "train.log"
        )
        train_seconds, rows = run.seconds, run.rows
        steps = max((int(r["step"]) for r in rows), default=0)
        if not (run_dir / "final_model" / "config.json").exists():
            sys.exit(
                f"the run finished no step in {args.minutes:g} min (engine start-up counts), so it exported no "
                f"final model; raise --minutes (log: {work / 'train.log'})"
            )
        print(f"  trained {steps} steps in {train_seconds:.0f} s", flush=True)
        after = evaluate(
            run_dir / "final_model", config_name, eval_overrides, work / "eval_after.log", "evaluate the final model"
        )
        load_end = os.getloadavg()
        reward_first = [r["reward_mean"] for r in rows[:5]]
        reward_last = [r["reward_mean"] for r in rows[-5:]]
        result = {
            "config": config_name,
            "overrides": args.overrides,
            "minutes": args.minutes,
            "eval_prompts": args.eval_prompts,
            "cpu": cpu_flags(),
            "cores": os.cpu_count(),
            "loadavg_start": load_start,
            "loadavg_end": load_end,
            "steps": steps,
            "train_wall_seconds": train_seconds,
            "total_wall_seconds": time.time() - started,
            "reward_mean_first5": sum(reward_first) / max(1, len(reward_first)),
            "reward_mean_last5": sum(reward_last) / max(1, len(reward_last)),
            "before": before,
            "after": after,
            "accuracy_gain": after["accuracy"] - before["accuracy"],
        }
        finished = True
    finally:
        if args.keep or not finished:
            print(f"kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    def line(name: str, r: dict) -> str:
        low, high = r["wilson95"]
        fmt = f"{r['format_mean']:.2f}" if r["format_mean"] is not None else "n/a"
        return (
            f"| {name} | {r['correct']}/{r['prompts']} | {r['accuracy']:.3f} | {low:.3f}-{high:.3f} | {fmt} | "
            f"{r['response_tokens_mean']:.0f} |"
        )

    print(
        f"\nCPU: {result['cpu']}, {result['cores']} cores; load average start "
        f"{' '.join(f'{x:.2f}' for x in load_start)}, end {' '.join(f'{x:.2f}' for x in load_end)}"
    )
    print(
        f"{config_name}: {steps} steps in {train_seconds / 60:.1f} min of training "
        f"(limit {args.minutes:g} min), {result['total_wall_seconds'] / 60:.1f} min in all; train reward_mean "
        f"{result['reward_mean_first5']:.3f} (first 5 steps) -> {result['reward_mean_last5']:.3f} (last 5)"
    )
    print("| model | solved | greedy accuracy | 95% Wilson | format reward | answer tokens |")
    print("|---|---|---|---|---|---|")
    print(line("base", before))
    print(line(f"after {steps} steps", after))
    print(f"accuracy gain {result['accuracy_gain']:+.3f}; wrote {out}")


if __name__ == "__main__":
    main()
