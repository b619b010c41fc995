"""The whole synchronous GRPO step, idle and beside a busy neighbour, by OpenMP setting.

    .venv/bin/python benchmarks/system/neighbour_step.py                      # default, gnu, 1 thread (~15 min)
    .venv/bin/python benchmarks/system/neighbour_step.py --arm default --arm "spin=GOMP_SPINCOUNT=10000"
    .venv/bin/python benchmarks/system/neighbour_step.py --precision float32  # the step of a CPU without fast bf16

The workload is ``trl_compare.py``'s (SmolLM2-135M-Instruct, 4 GSM8K prompts x 4 answers, 64 new tokens, KL 0.04),
run by the same worker (``_ours_worker.py``: collect, reference, train, push weights) with the default precision
(``auto``) unless ``--precision`` says otherwise. Each arm is one worker process started with its own
environment (OpenMP reads it once, when torch loads): after ``--warmup`` untimed steps it runs ``--pairs`` x 2
idle steps and as many with a neighbour, in the order idle, busy, busy, idle, ... so that drift hits both alike.
The neighbour is one process running a plain Python busy loop (one core kept busy), started by this script
before a step and killed after it. Arms run one after another; nothing else should run on the machine (the
load average is printed before and after every arm).

Arms are ``NAME`` or ``NAME=VAR=VALUE,VAR=VALUE``; the built-in ones:

* ``default``: what our scripts set up (every available core; ``grpo_rl.OPENMP_DEFAULTS``, set when grpo_rl is
  imported before torch);
* ``gnu``: the GNU OpenMP runtime's own defaults (the worker loads torch before grpo_rl): a thread that reaches a
  barrier spins for a while before it sleeps;
* ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (a waiting thread sleeps at once); ``active``: it always spins;
* ``threads1``: one torch thread.

Prints the CPU flags, a table of mean idle and busy step times and their ratio, and writes
``benchmarks/results/neighbour_step-<time>.json``. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS, ROOT  # noqa: E402
from benchmarks.common.machine import machine  # noqa: E402
from benchmarks.versus_trl.trl_compare import COMMON_OURS, OURS_WORKER, Arm, Worker, prepare_prompts  # noqa: E402

BUILTIN = {
    "default": {},
    "gnu": {"_TORCH_FIRST": "1"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
    "threads1": {"_THREADS": "1"},
}
BUSY_LOOP = "while True: pass"


def parse_arm(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition("=")
    if not rest:
        if name not in BUILTIN:
            raise SystemExit(f"--arm: unknown arm {name!r}; built in: {', '.join(BUILTIN)}, or NAME=VAR=VALUE,...")
        return name, dict(BUILTIN[name])
    env = {}
    for pair in rest.split(","):
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--arm {spec!r}: write NAME=VAR=VALUE[,VAR=VALUE]")
        env[key] = value
    return name, env


def run_arm(name: str, extra_env: dict, args, prompts: Path, log_dir: Path) -> dict:
    cores = args.threads
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(cores),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        VLLM_LOGGING_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    env.pop("OMP_WAIT_POLICY", None)
    threads = int(extra_env.pop("_THREADS", cores))
    torch_first = ["--torch-first"] if extra_env.pop("_TORCH_FIRST", None) else []
    env.update(extra_env, OMP_NUM_THREADS=str(threads))
    overrides = list(COMMON_OURS) + ["train.share_prompt=true"]
    if args.precision != "auto":
        overrides += [f"{role}.precision={args.precision}" for role in ("train_model", "ref_model", "inference_model")]
    arm = Arm("ours", name, overrides)
    cmd = [
        sys.executable,
        str(OURS_WORKER),
        "--prompts",
        str(prompts),
        "--threads",
        str(threads),
        *torch_first,
        *overrides,
    ]
    load_before = os.getloadavg()[0]
    worker = Worker(arm, cmd, env, log_dir / f"{name}.log")
    idle, busy, idle_tok, busy_tok = [], [], [], []
    try:
        ready = worker.read_event()
        print(
            f"arm {name} ({threads} threads, {extra_env or 'no extra environment'}): ready in "
            f"{ready['startup_s']:.1f} s, load average {load_before:.2f}",
            flush=True,
        )
        plan = (
            ["warm-up"] * args.warmup
            + ["idle", "busy", "busy", "idle"] * (args.pairs // 2)
            + ["idle", "busy"] * (args.pairs % 2)
        )
        for kind in plan:
            spinner = None
            if kind == "busy":
                spinner = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
                time.sleep(0.5)
            try:
                worker.send("step")
                ev = worker.read_event()
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
            if kind != "warm-up":
                (idle if kind == "idle" else busy).append(ev["seconds"])
                (idle_tok if kind == "idle" else busy_tok).append(ev["completion_tokens"])
            print(
                f"  {kind:8s} {ev['seconds']:7.2f} s  (generation {ev['generation_s']:.2f}, reference "
                f"{ev['reference_s']:.2f}, training {ev['training_s']:.2f})  load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    finally:
        worker.close()
    return {
        "arm": name,
        "env": extra_env,
        "threads": threads,
        "idle_s": idle,
        "busy_s": busy,
        "idle_mean_s": statistics.mean(idle),
        "busy_mean_s": statistics.mean(busy),
        "slowdown": statistics.mean(busy) / statistics.mean(idle),
        "idle_tokens": idle_tok,
        "busy_tokens": busy_tok,
        # steps differ in their prompts and answer lengths: the same ratio per completion token
        "slowdown_per_token": (sum(busy) / sum(busy_tok)) / (sum(idle) / sum(idle_tok)),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", action="append", dest="arms", help="repeatable; default: default, gnu, threads1")
    parser.add_argument("--pairs", type=int, default=2, help="idle/busy step pairs per arm")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (the first two run slower)")
    parser.add_argument("--precision", choices=["auto", "float32", "bfloat16"], default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the available cores)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from grpo_rl.model.precision import cpu_flags
    from grpo_rl.placement.devices import available_cpus

    args.threads = args.threads or available_cpus()
    arms = [parse_arm(a) for a in (args.arms or ["default", "gnu", "threads1"])]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"neighbour_step-{stamp}-logs"
    log_dir.mkdir(parents=True)
    prompts = log_dir / "prompts.json"
    prepare_prompts(args.warmup + 2 * args.pairs, prompts)
    host = machine()
    print(f"CPU: {host['cpu']}, {cpu_flags()}, {args.threads} cores available; precision {args.precision}", flush=True)
    rows = [run_arm(name, env, args, prompts, log_dir) for name, env in arms]
    print("\n| arm | threads | environment | idle step (s) | with a busy loop (s) | slowdown | per answer token |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        env = ", ".join(f"{k}={v}" for k, v in r["env"].items()) or "-"
        print(
            f"| {r['arm']} | {r['threads']} | {env} | {r['idle_mean_s']:.2f} | {r['busy_mean_s']:.2f} | "
            f"{r['slowdown']:.2f}x | {r['slowdown_per_token']:.2f}x |"
        )
    path = args.out / f"neighbour_step-{stamp}.json"
    path.write_text(
        json.dumps(
            {
                "machine": host,
                "cpu_flags": cpu_flags(),
                "precision": args.precision,
                "command": " ".join(sys.argv),
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
