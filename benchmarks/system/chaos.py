"""A run that heals itself, under fire: an asynchronous run whose collector and reference actors are SIGKILLed at
random, against the same run left alone.

    python benchmarks/system/chaos.py --quick                 # a tiny model, two collector kills, under 6 minutes
    python benchmarks/system/chaos.py                          # about 10 minutes a run: kills every ~60 s, both roles
    python benchmarks/system/chaos.py --steps 40 --kill-every 30 --roles collector,reference --collectors 2

Each run is ``sota/grpo-async.py`` with ``--collectors`` collector actors (real vLLM engines in Ray actors) and,
when ``reference`` is among ``--roles``, the reference model as an actor of its own (``ref_model.placement=actor``).
The chaos run kills a worker of a random role in ``--roles`` (its process id from the run's ``processes.json``)
after exponentially distributed waits of mean ``--kill-every`` seconds, from its first logged step on; ``--quick``
kills collector 0 once a third of the steps are logged and collector 1 at two thirds. The baseline is the same
run without kills, in the same invocation.

It prints the CPU and load, and per run: steps done, replacements (``restarts.jsonl``), the seconds each cost,
throughput in steps per second from the first logged step to the last, and for the chaos run the throughput lost
against the baseline; it checks that ``trained.jsonl`` trains every batch of the prompt stream at most once and
every batch below the final checkpoint's watermark exactly once. The last line is
``exactly-once: ok, restarts: N, steps: M/M`` (or ``exactly-once: FAILED ...``). Writes JSON. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common.machine import announce_machine, cpu_line  # noqa: E402
from benchmarks.common.runner import read_jsonl, run_script  # noqa: E402


def overrides(args, model: str) -> list[str]:
    out = [
        f"model.name={model}",
        f"train.steps={args.steps}",
        "logger.backend=none",
        "logger.num_examine=0",
        "eval.every=0",
        f"inference_model.num_devices={args.collectors}",
        f"env.prompts_per_step={args.prompts}",
        f"env.group_size={args.group}",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        f"pipeline.max_restarts={args.max_restarts}",
        f"pipeline.timeout_seconds={args.timeout}",
        "train.checkpoint_frequency=5",
        "inference_model.kv_cache_gb=1",
        "inference_model.max_model_len=1024",
    ]
    if "reference" in args.roles:
        out += ["policy.kl_coef=0.01", "ref_model.placement=actor"]
    else:
        out += ["policy.kl_coef=0"]
    return out + list(args.override)


class Killer(threading.Thread):
    """SIGKILLs workers of a run: at random (mean ``every`` seconds apart) or at the given step counts."""

    def __init__(
        self, run_dir: Path, roles: list[str], every: float, plan: list[tuple[int, str, int]] | None, seed: int
    ):
        super().__init__(daemon=True)
        self.run_dir, self.roles, self.every, self.plan = run_dir, roles, every, plan
        self.rng = random.Random(seed)
        self.done = threading.Event()
        self.kills: list[dict] = []

    def steps(self) -> int:
        return len(read_jsonl(self.run_dir / "metrics.jsonl"))

    def kill(self, role: str, index: int | None = None) -> None:
        try:
            table = json.loads((self.run_dir / "processes.json").read_text())
        except (FileNotFoundError, ValueError):
            return
        pids = table.get(role) or []
        if not pids:
            return
        index = self.rng.randrange(len(pids)) if index is None else index
        try:
            os.kill(pids[index], signal.SIGKILL)
        except ProcessLookupError:
            return
        self.kills.append({"time": time.time(), "step": self.steps(), "role": role, "index": index, "pid": pids[index]})
        print(f"  killed {role} {index} (pid {pids[index]}) after step {self.steps()}", flush=True)

    def run(self) -> None:
        while not self.done.is_set() and self.steps() < 1:
            time.sleep(0.2)
        if self.plan is not None:
            for steps, role, index in self.plan:
                while not self.done.is_set() and self.steps() < steps:
                    time.sleep(0.2)
                if self.done.is_set():
                    return
                self.kill(role, index)
            return
        while not self.done.wait(self.rng.expovariate(1.0 / self.every)):
            self.kill(self.rng.choice(self.roles))


def run_once(args, model: str, run_dir: Path, killer: Killer | None) -> dict:
    log_path = run_dir.with_suffix(".log")
    if killer is not None:
        killer.start()  # it waits for the run's first logged step
    try:
        run = run_script(
            "grpo-async.py",
            overrides(args, model),
            run_dir=run_dir,
            log=log_path,
            timeout=args.run_timeout,
            check=False,
        )
    finally:
        if killer is not None:
            killer.done.set()
    records = read_jsonl(run_dir / "trained.jsonl")
    restarts = read_jsonl(run_dir / "restarts.jsonl")
    ends = [r["time"] for r in records]
    throughput = (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 else float("nan")
    return {
        "returncode": run.returncode,
        "log": str(log_path),
        "wall_seconds": run.seconds,
        "steps": len(run.rows),
        "throughput_steps_per_second": throughput,
        "restarts": restarts,
        "restart_seconds": [r["seconds"] for r in restarts],
        "kills": killer.kills if killer else [],
        "exactly_once": exactly_once(run_dir, records, args.steps),
    }


def exactly_once(run_dir: Path, records: list[dict], steps: int) -> str:
    """``ok``, or what is wrong: a step logged twice or missing, a group trained twice, or a group below the final
    checkpoint's watermark never trained."""
    from grpo_rl.run.checkpoint import Checkpointer, load_trainer_state

    logged = [r["step"] for r in records]
    if logged != list(range(1, len(logged) + 1)):
        return f"FAILED steps logged {logged}"
    trained = [g for r in records for g in r["group_index"]]
    if len(trained) != len(set(trained)):
        return f"FAILED a group trained twice: {sorted(trained)}"
    checkpoint = Checkpointer(run_dir).latest()
    if checkpoint is None:
        return "FAILED no checkpoint"
    stream = load_trainer_state(checkpoint)["env"]
    expected = set(range(stream["next_group"])) | set(stream["consumed_groups"])
    if expected != set(trained):
        return f"FAILED trained {sorted(trained)}, the checkpoint's stream says {sorted(expected)}"
    if len(logged) != steps:
        return f"FAILED {len(logged)} of {steps} steps"
    return "ok"


def tiny_model(out: Path) -> str:
    from transformers import AutoTokenizer

    from grpo_rl.model.loading import build_tiny_model, resolve_model

    tokenizer = out / "tokenizer"
    AutoTokenizer.from_pretrained(resolve_model("embedded:smollm2-135m-instruct")).save_pretrained(tokenizer)
    return str(build_tiny_model(str(tokenizer), out / "tiny", hidden_size=64, num_heads=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, 24 steps, two collector kills")
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument("--roles", default="collector,reference", help="roles whose workers are killed")
    parser.add_argument("--kill-every", type=float, default=60.0, help="mean seconds between kills")
    parser.add_argument("--max-restarts", type=int, default=100)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=300.0, help="pipeline.timeout_seconds")
    parser.add_argument("--run-timeout", type=float, default=1800.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("override", nargs="*", help="more Hydra overrides for both runs")
    args = parser.parse_args()
    args.roles = args.roles.split(",")
    if args.quick:
        args.steps, args.roles, args.max_new_tokens, args.prompts = 24, ["collector"], 16, 2
    announce_machine()
    work = Path(tempfile.mkdtemp(prefix="grpo_chaos_"))
    model = tiny_model(work) if args.quick else args.model
    results = {"cpu": cpu_line(), "args": {k: v for k, v in vars(args).items() if k != "out"}}
    if not args.no_baseline:
        print(f"baseline: {args.steps} steps, no kills", flush=True)
        results["baseline"] = run_once(args, model, work / "baseline", None)
    third = max(1, args.steps // 3)
    plan = [(third, "collector", 0), (2 * third, "collector", min(1, args.collectors - 1))] if args.quick else None
    print(
        f"chaos: {args.steps} steps, kills "
        + (
            "at steps " + ", ".join(str(p[0]) for p in plan)
            if plan
            else f"every ~{args.kill_every:g} s of {args.roles}"
        ),
        flush=True,
    )
    killer = Killer(work / "chaos", args.roles, args.kill_every, plan, args.seed)
    results["chaos"] = chaos = run_once(args, model, work / "chaos", killer)
    results["cpu_after"] = cpu_line()

    print(f"\n{'run':<10}{'rc':>4}{'steps':>8}{'kills':>7}{'restarts':>10}{'s/restart':>11}{'steps/s':>10}")
    for name in ("baseline", "chaos"):
        r = results.get(name)
        if r is None:
            continue
        per = statistics.mean(r["restart_seconds"]) if r["restart_seconds"] else 0.0
        print(
            f"{name:<10}{r['returncode']:>4}{r['steps']:>8}{len(r['kills']):>7}{len(r['restarts']):>10}"
            f"{per:>11.1f}{r['throughput_steps_per_second']:>10.3f}"
        )
    if "baseline" in results:
        base = results["baseline"]["throughput_steps_per_second"]
        lost = 1 - chaos["throughput_steps_per_second"] / base
        print(
            f"throughput lost to the kills: {100 * lost:.1f}% ({chaos['throughput_steps_per_second']:.3f} vs "
            f"{base:.3f} steps/s)"
        )
        results["throughput_lost"] = lost
    for r in chaos["restarts"]:
        print(f"  {r['role']} {r['replica']}: {r['cause']}; replaced in {r['seconds']:.1f} s")
    print(results["cpu_after"])
    out = args.out or work / "chaos.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"JSON: {out}; logs: {work}")
    print(
        f"exactly-once: {chaos['exactly_once']}, restarts: {len(chaos['restarts'])}, "
        f"steps: {chaos['steps']}/{args.steps}"
    )


if __name__ == "__main__":
    main()
