"""What oneDNN's kernel caches cost and save at bf16: memory that grows with each new token count, and time.

    .venv/bin/python benchmarks/micro/onednn_cache.py     # capacities 1024 (oneDNN's own), 128, 64, 32, 8
    .venv/bin/python benchmarks/micro/onednn_cache.py --capacities 1024,128 --micro-batches 80

Each arm runs in its own process with ``LRU_CACHE_CAPACITY`` and ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` set to the
capacity (``grpo_rl`` sets 64 on import unless given). The workload is a stack of decoder blocks with
SmolLM2-135M's linear shapes (q, k, v, o, gate, up, down; random bf16 weights), run forward, forward again (as
gradient checkpointing recomputes) and backward over micro-batches whose token counts vary as an RL batch's do:
each micro-batch draws a count from 200-700 (the same seeded draws in every arm). Reported per arm: how much
memory glibc has handed out and not taken back (``mallinfo2``) after the warm-up and after the last micro-batch,
and the seconds per micro-batch; plus a baseline in the default arm's process, the same micro-batches at one
token count (every kernel a cache hit). Writes ``benchmarks/results/onednn_cache.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import machine, malloc_gib  # noqa: E402

HIDDEN, INTERMEDIATE, KV = 576, 1536, 192  # SmolLM2-135M: 9 query heads and 3 key/value heads of 64


def arm(layers: int, micro_batches: int, threads: int, baseline: bool) -> dict:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)

    def weight(out_f: int, in_f: int) -> torch.Tensor:
        return (torch.randn(out_f, in_f, generator=gen) * in_f**-0.5).bfloat16().requires_grad_()

    blocks = [
        {
            name: weight(o, i)
            for name, (o, i) in dict(
                q=(HIDDEN, HIDDEN),
                k=(KV, HIDDEN),
                v=(KV, HIDDEN),
                o=(HIDDEN, HIDDEN),
                gate=(INTERMEDIATE, HIDDEN),
                up=(INTERMEDIATE, HIDDEN),
                down=(HIDDEN, INTERMEDIATE),
            ).items()
        }
        for _ in range(layers)
    ]

    def pass_(tokens: int) -> None:
        x = torch.randn(tokens, HIDDEN, generator=gen).bfloat16().requires_grad_()
        for _ in range(2):  # the forward, and gradient checkpointing's recompute of it
            h = x
            for b in blocks:
                q, k, v = F.linear(h, b["q"]), F.linear(h, b["k"]), F.linear(h, b["v"])
                h = h + F.linear(q + k.repeat(1, 3) + v.repeat(1, 3), b["o"])
                h = h + F.linear(F.silu(F.linear(h, b["gate"])) * F.linear(h, b["up"]), b["down"])
        h.float().pow(2).mean().backward()
        for b in blocks:
            for w in b.values():
                w.grad = None

    draws = random.Random(0)
    counts = [draws.randint(200, 700) for _ in range(micro_batches)]
    for tokens in (256, 320):  # warm-up: threads, allocator, the first kernels
        pass_(tokens)
    before = malloc_gib()[0] * 1024
    t0 = time.perf_counter()
    for tokens in counts:
        pass_(tokens)
    seconds = (time.perf_counter() - t0) / micro_batches
    out = {
        "distinct_token_counts": len(set(counts)),
        "malloc_in_use_mib_before": before,
        "malloc_in_use_mib_after": malloc_gib()[0] * 1024,
        "seconds_per_micro_batch": seconds,
    }
    if baseline:  # the same work at one token count: every kernel a hit
        mean = round(sum(counts) / len(counts))
        t0 = time.perf_counter()
        for _ in counts:
            pass_(mean)
        out["one_token_count_seconds_per_micro_batch"] = (time.perf_counter() - t0) / micro_batches
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacities", default="1024,128,64,32,8")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--micro-batches", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arm", type=int, help=argparse.SUPPRESS)  # run one capacity in this process
    parser.add_argument("--json", default=str(RESULTS / "onednn_cache.json"))
    args = parser.parse_args()
    capacities = [int(c) for c in args.capacities.split(",")]
    if args.arm is not None:
        print(json.dumps(arm(args.layers, args.micro_batches, args.threads, baseline=args.arm == capacities[0])))
        return
    print(json.dumps(machine()), flush=True)
    print(f"load average before: {os.getloadavg()}", flush=True)
    rows = []
    for capacity in capacities:
        env = {
            **os.environ,
            "LRU_CACHE_CAPACITY": str(capacity),
            "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(capacity),
            "OMP_NUM_THREADS": str(args.threads),
        }
        cmd = [
            sys.executable,
            __file__,
            "--arm",
            str(capacity),
            "--capacities",
            args.capacities,
            "--layers",
            str(args.layers),
            "--micro-batches",
            str(args.micro_batches),
            "--threads",
            str(args.threads),
        ]
        done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        out = json.loads(done.stdout.splitlines()[-1])
        rows.append({"capacity": capacity, **out})
        grown = out["malloc_in_use_mib_after"] - out["malloc_in_use_mib_before"]
        line = (
            f"capacity {capacity:5d}: {out['distinct_token_counts']} token counts, malloc in use grew "
            f"{grown:7.1f} MiB, {out['seconds_per_micro_batch']:.3f} s a micro-batch"
        )
        if "one_token_count_seconds_per_micro_batch" in out:
            line += f" (one token count, every kernel a hit: {out['one_token_count_seconds_per_micro_batch']:.3f} s)"
        print(line, flush=True)
    print(f"load average after: {os.getloadavg()}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps({"machine": machine(), "layers": args.layers, "threads": args.threads, "arms": rows}, indent=2)
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
