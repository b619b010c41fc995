"""``Learner.train_step`` called again and again in one fresh process, with or without other work between the calls.

    .venv/bin/python benchmarks/micro/interleaved_step.py                          # every arm, bf16, 8 calls each
    .venv/bin/python benchmarks/micro/interleaved_step.py --precision fp32 --arms none,reference

Inside a run the training phase took 1.2-1.5x the same ``train_step`` timed alone (``system/train_phase.py``). A run
calls ``train_step`` with generation and the reference's scoring between two calls; this script keeps the learner
and the batch fixed (the workload's packed micro-batch of ``micro/learner_levers.py``) and changes only what runs
between the calls, one fresh process per arm:

* ``none``: nothing (``train_step`` back to back);
* ``reference``: a no-grad forward of a second copy of the model over the same batch (the reference's pass);
* ``own``: the same no-grad forward with the learner's own model;
* ``alloc``: 2 GiB allocated, written and freed in 256 MiB tensors (the memory a forward churns, without a forward).

Per call: wall seconds, the process's CPU seconds (both threads) and minor page faults. The first call allocates
the optimizer's state and is reported apart. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine, cpu_line  # noqa: E402

ARMS = ("none", "reference", "own", "alloc")


def child(arm: str, precision: str, calls: int, threads: int) -> dict:
    import torch

    from benchmarks.micro.learner_levers import _learner, _training_batch
    from grpo_rl.model.loading import load_causal_lm
    from grpo_rl.model.logprobs import sequence_logprobs

    torch.set_num_threads(threads)
    bf16 = precision == "bf16"
    path, batch = _training_batch()
    learner = _learner(path, bf16)
    reference = load_causal_lm(path, torch.device("cpu"), "float32") if arm == "reference" else None

    def between() -> None:
        if arm in ("reference", "own"):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                sequence_logprobs(reference if arm == "reference" else learner.model, batch, share_prompt=True)
        elif arm == "alloc":
            junk = [torch.ones(256 * 2**20 // 4) for _ in range(8)]
            del junk

    out = []
    for _ in range(calls):
        faults, cpu, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), time.perf_counter()
        learner.train_step(batch.clone())
        out.append(
            {
                "wall_s": time.perf_counter() - t0,
                "cpu_s": time.process_time() - cpu,
                "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
            }
        )
        between()
    return {"arm": arm, "precision": precision, "calls": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="the arms in turn, this many times")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=str(RESULTS / "interleaved_step.json"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.precision, args.calls, args.threads)))
        return
    announce_machine()
    results = []
    for i in range(args.repeat):
        for arm in args.arms.split(","):
            if arm not in ARMS:
                parser.error(f"--arms: {arm!r} is not one of {', '.join(ARMS)}")
            cmd = [sys.executable, __file__, "--child", arm, "--precision", args.precision, "--calls", str(args.calls)]
            cmd += ["--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            r["repeat"] = i
            results.append(r)
            later = r["calls"][1:]
            walls = [c["wall_s"] for c in later]
            print(
                f"{arm:>10} {args.precision}: first call {r['calls'][0]['wall_s']:.2f} s; later calls "
                f"{' '.join(f'{w:.2f}' for w in walls)} s (median {statistics.median(walls):.2f}); "
                f"CPU / wall {statistics.median(c['cpu_s'] / c['wall_s'] for c in later):.2f}; "
                f"faults {statistics.median(c['faults'] for c in later) / 1e3:.0f}k a call",
                flush=True,
            )
    print(cpu_line())
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"args": vars(args), "cpu": cpu_line(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
