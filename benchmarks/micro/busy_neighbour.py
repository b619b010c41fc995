"""How a busy neighbour slows fp32 matmuls, by torch thread count and OpenMP wait policy.

    python benchmarks/micro/busy_neighbour.py                 # ~3 min; results/busy_neighbour.json
    python benchmarks/micro/busy_neighbour.py --reps 20 --size 2048 576 1536

Each setting runs in a fresh process (OpenMP reads its environment once, at torch's import): ``--reps`` timed
matmuls of ``[M, K] @ [K, N]`` fp32 (default the shape of one SmolLM2-135M MLP projection over 2048 tokens), after a
warm-up, reporting the median and the mean. Every setting is measured idle and with a neighbour: one process spinning a
plain Python busy loop, started by this script and killed after. ``--neighbour torch``: a process doing fp32 matmuls
with a thread per core, as another training job would. Settings: torch threads 1 and all available cores, each with the
default OpenMP wait policy and with ``OMP_WAIT_POLICY=PASSIVE``. Prints the CPU flags and the load average before the
run; the machine must otherwise be idle. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402

WORKER = r"""
import sys, time, torch
m, k, n, reps = (int(x) for x in sys.argv[1:5])
torch.manual_seed(0)
a, b = torch.randn(m, k), torch.randn(k, n)
for _ in range(3):
    a @ b
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - t0)
total = sum(times)
times.sort()
print(torch.get_num_threads(), times[len(times) // 2], total / len(times))
"""


NEIGHBOURS = {
    "python": "while True: pass",  # one core kept busy
    "torch": "import torch\na = torch.randn(1024, 1024)\nwhile True: a @ a",  # OpenMP threads on every core
}


def measure(threads: int, passive: bool, shape: list[int], reps: int) -> tuple[float, float]:
    """(median, mean) seconds per matmul: a neighbour shows in the mean (a thread descheduled for a time slice
    stalls every other one at the next barrier) more than in the median."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("OMP_WAIT_POLICY", None)
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run(
        [sys.executable, "-c", WORKER, *map(str, shape), str(reps)], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(out[0]) == threads, out
    return float(out[1]), float(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, nargs=3, default=[2048, 576, 1536], metavar=("M", "K", "N"))
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument(
        "--neighbour",
        choices=sorted(NEIGHBOURS),
        default="python",
        help="python: a busy loop on one core; torch: matmuls on every core (another training job)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "busy_neighbour.json")
    args = parser.parse_args()

    from grpo_rl.model.precision import cpu_flags
    from grpo_rl.placement.devices import available_cpus

    cores = available_cpus()
    print(
        f"CPU: {cpu_flags()}, {cores} cores available, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; matmul {args.size}, median of {args.reps}",
        flush=True,
    )
    settings = [(t, p) for t in sorted({1, cores}) for p in (False, True)]
    rows = []
    for threads, passive in settings:
        idle, idle_mean = measure(threads, passive, args.size, args.reps)
        spinner = subprocess.Popen(
            [sys.executable, "-c", NEIGHBOURS[args.neighbour]], env=dict(os.environ, OMP_NUM_THREADS=str(cores))
        )
        try:
            time.sleep(0.5)
            busy, busy_mean = measure(threads, passive, args.size, args.reps)
        finally:
            spinner.kill()
            spinner.wait()
        rows.append(
            {
                "threads": threads,
                "wait_policy": "passive" if passive else "default",
                "idle_median_s": idle,
                "idle_mean_s": idle_mean,
                "busy_median_s": busy,
                "busy_mean_s": busy_mean,
            }
        )
        print(
            f"  threads {threads}, wait policy {rows[-1]['wait_policy']}: median idle {idle * 1e3:.2f} ms, busy "
            f"{busy * 1e3:.2f} ms; mean idle {idle_mean * 1e3:.2f} ms, busy {busy_mean * 1e3:.2f} ms",
            flush=True,
        )
    best = min(r["idle_mean_s"] for r in rows)
    print(
        "\n| threads | OMP wait policy | idle median / mean (ms) | busy neighbour median / mean (ms) | "
        "slowdown of the mean | busy mean vs best idle mean |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['threads']} | {r['wait_policy']} | {r['idle_median_s'] * 1e3:.2f} / {r['idle_mean_s'] * 1e3:.2f} | "
            f"{r['busy_median_s'] * 1e3:.2f} / {r['busy_mean_s'] * 1e3:.2f} | "
            f"{r['busy_mean_s'] / r['idle_mean_s']:.1f}x | {r['busy_mean_s'] / best:.1f}x |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "cpu": cpu_flags(),
                "cores": cores,
                "size": args.size,
                "reps": args.reps,
                "neighbour": args.neighbour,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
