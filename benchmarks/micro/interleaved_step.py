"""``Learner.train_step`` called again and again in one fresh process, with or without other work between the calls.

    .venv/bin/python benchmarks/micro/interleaved_step.py                          # every arm, bf16, 8 calls each
    .venv/bin/python benchmarks/micro/interleaved_step.py --precision fp32 --arms none,reference

Inside a run the first few training phases took longer than the same ``train_step`` timed alone
(``system/train_phase.py``). A run calls ``train_step`` with generation, the reference's scoring and a weight push
between two calls; this script keeps the learner and the batch fixed (the workload's packed micro-batch of
``micro/learner_levers.py``) and changes only what runs between the calls, one fresh process per arm:

* ``none``: nothing (``train_step`` back to back);
* ``reference``: a no-grad forward of a second copy of the model over the same batch (the reference's pass);
* ``own``: the same no-grad forward with the learner's own model;
* ``alloc``: 2 GiB allocated, written and freed in 256 MiB tensors (the memory a forward churns, without a forward);
* ``engine``: the run's in-process vLLM engine started before the learner (it binds the OpenMP threads and holds
  its KV cache) and left idle;
* ``generate``: that engine samples the workload's answers (its prompts, ``G`` answers each) between the calls;
* ``push``: it samples them and then takes the learner's weights, as a synchronous step does;
* ``shapes``: nothing between the calls, but after the first each call's answers are cut a few tokens shorter, so
  that the calls go twice over the same few new shapes (a run's batches have a new token count every step): a new
  shape's first call against its second.

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

ARMS = ("none", "reference", "own", "alloc", "engine", "generate", "push", "shapes")


def shorter(call: int, calls: int) -> int:
    """Answer tokens the ``shapes`` arm cuts at ``call``: none at the first, then ``1 .. K`` twice over."""
    if call == 0:
        return 0
    k = max((calls - 1) // 2, 1)
    return 1 + (call - 1) % k


def child(arm: str, precision: str, calls: int, threads: int) -> dict:
    import torch

    from benchmarks.micro.learner_levers import _learner, _training_batch
    from grpo_rl.model.loading import load_causal_lm
    from grpo_rl.model.logprobs import sequence_logprobs
    from grpo_rl.model.packing import trim_padding

    torch.set_num_threads(threads)
    bf16 = precision == "bf16"
    path, batch = _training_batch()
    engine = None
    if arm in ("engine", "generate", "push"):
        from grpo_rl.engines.base import SamplingSpec
        from grpo_rl.engines.vllm_engine import VLLMEngine

        engine = VLLMEngine(str(path), torch.device("cpu"), max_model_len=1024, kv_cache_gb=1.0)
        group = int((batch["group_id"] == 0).sum())
        firsts = zip(batch["prompt_ids"][::group], batch["prompt_mask"][::group], strict=True)
        prompts = [row[mask.bool()].tolist() for row, mask in firsts]
        sampling = SamplingSpec(max_new_tokens=batch["response_ids"].shape[1], seed=0)
    learner = _learner(path, bf16)
    reference = load_causal_lm(path, torch.device("cpu"), "float32") if arm == "reference" else None

    def between() -> None:
        if arm in ("reference", "own"):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                sequence_logprobs(reference if arm == "reference" else learner.model, batch, share_prompt=True)
        elif arm == "alloc":
            junk = [torch.ones(256 * 2**20 // 4) for _ in range(8)]
            del junk
        elif arm in ("generate", "push"):
            assert engine is not None
            engine.generate(prompts, group, sampling)
            if arm == "push":
                engine.update_weights(learner.weights_for_push())

    out = []
    for i in range(calls):
        cut = shorter(i, calls) if arm == "shapes" else 0
        call_batch = batch.clone()
        if cut:
            call_batch["response_mask"][:, -cut:] = 0
            call_batch = trim_padding(call_batch)
        faults, cpu, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), time.perf_counter()
        learner.train_step(call_batch)
        out.append(
            {
                "wall_s": time.perf_counter() - t0,
                "cpu_s": time.process_time() - cpu,
                "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
                "tokens_cut": cut,
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
    if "shapes" in args.arms.split(",") and args.calls < 3:
        parser.error("--arms shapes: needs --calls 3 or more (a first call, then each new shape twice)")
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
            if arm == "shapes":
                seen, fresh = set(), []
                for c in later:
                    fresh.append(c["tokens_cut"] not in seen)
                    seen.add(c["tokens_cut"])
                new_s = statistics.median(c["wall_s"] for c, f in zip(later, fresh, strict=True) if f)
                old_s = statistics.median(c["wall_s"] for c, f in zip(later, fresh, strict=True) if not f)
                print(f"{'':>10} a new shape's first call {new_s:.2f} s, its second {old_s:.2f} s (medians)")
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
