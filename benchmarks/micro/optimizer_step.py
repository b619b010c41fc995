"""One optimizer step over SmolLM2-135M's parameter shapes: torch's fused AdamW against the 8-bit AdamWs.

    .venv/bin/python benchmarks/micro/optimizer_step.py                      # every arm, 5 steps each
    .venv/bin/python benchmarks/micro/optimizer_step.py --arms adamw,adamw8bit-bf16 --steps 10

Arms, each in its own process (so that one arm's memory and compiled kernels do not touch the next):

* ``adamw``: ``optimizer.name=adamw`` (torch's fused AdamW), fp32 weights, fp32 moments.
* ``adamw8bit``: ``optimizer.name=adamw8bit`` (torchao's AdamW8bit), fp32 weights.
* ``adamw8bit-bf16``: the same over bf16 weights, with stochastic rounding (the ``lowmem`` preset on a bf16 CPU).
* ``bnb``: bitsandbytes' ``AdamW8bit`` on the CPU, fp32 weights, if bitsandbytes is installed (it is not a
  dependency: ``pip install bitsandbytes`` to include it).

The parameters are random tensors of the model's shapes (embedding 49152 x 576, 30 layers); every step gets fresh
random gradients. Reported per arm: the first step (it compiles, for torchao), the median of the others, the
optimizer state's bytes and the process's peak RSS. Prints the CPU flags and the load average. Never asserts a time.
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
from benchmarks.common.machine import machine, peak_rss_gib, set_threads  # noqa: E402

ARMS = ("adamw", "adamw8bit", "adamw8bit-bf16", "bnb")
# SmolLM2-135M: tied embedding, 30 layers of q/o (576 x 576), k/v (192 x 576), gate/up/down (1536 x 576), 2 norms.
SHAPES = [(49152, 576)] + [(576, 576)] * 60 + [(192, 576)] * 60 + [(1536, 576)] * 90 + [(576,)] * 61


def state_bytes(optimizer) -> int:
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if hasattr(value, "__tensor_flatten__"):
                names, _ = value.__tensor_flatten__()
                total += sum(getattr(value, n).numel() * getattr(value, n).element_size() for n in names)
            elif hasattr(value, "numel") and value.dim() > 0:
                total += value.numel() * value.element_size()
    return total


def run_arm(arm: str, steps: int, threads: int) -> dict:
    """In a worker process: build ``arm``'s optimizer and time ``steps`` steps."""
    import grpo_rl  # noqa: F401  (first: its OpenMP defaults apply before torch loads)

    set_threads(threads)
    import torch

    from grpo_rl.model.optim import make_optimizer

    torch.manual_seed(0)
    dtype = torch.bfloat16 if arm.endswith("bf16") else torch.float32
    params = [torch.nn.Parameter(torch.randn(s, dtype=dtype) * 0.02) for s in SHAPES]
    kwargs = dict(lr=1e-5, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    if arm == "bnb":
        import bitsandbytes

        optimizer = bitsandbytes.optim.AdamW8bit(params, **kwargs)
    else:
        optimizer = make_optimizer(params, arm.split("-")[0], torch.device("cpu"), **kwargs)
    seconds = []
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        t0 = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - t0)
    return {
        "arm": arm,
        "parameters": sum(p.numel() for p in params),
        "first_step_s": seconds[0],
        "median_step_s": statistics.median(seconds[1:]) if steps > 1 else float("nan"),
        "steps_s": seconds,
        "state_gib": state_bytes(optimizer) / 2**30,
        "peak_rss_gib": peak_rss_gib(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=RESULTS / "optimizer_step.json")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_arm(args.worker, args.steps, args.threads)))
        return
    info = machine()
    print(f"{info['cpu']}, {info['cores']} cores, {' '.join(info['isa'])}; load average {os.getloadavg()}", flush=True)
    results = []
    for arm in args.arms.split(","):
        if arm not in ARMS:
            raise SystemExit(f"--arms: unknown arm {arm!r}; choose from {', '.join(ARMS)}")
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", arm, "--steps", str(args.steps), "--threads", str(args.threads)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{arm:16s} did not run: {last}", flush=True)
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        print(
            f"{arm:16s} first step {r['first_step_s']:7.2f} s   then {r['median_step_s']:6.3f} s/step   "
            f"state {r['state_gib']:5.2f} GiB   peak RSS {r['peak_rss_gib']:5.2f} GiB   "
            f"load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"machine": info, "steps": args.steps, "threads": args.threads, "arms": results}, indent=2)
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
