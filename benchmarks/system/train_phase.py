"""The training phase inside a run against the same ``train_step`` out of it: where the run's extra time comes from.

    .venv/bin/python benchmarks/system/train_phase.py                         # bf16 (ours:best), 1 + 4 steps
    .venv/bin/python benchmarks/system/train_phase.py --precision float32 --steps 6
    .venv/bin/python benchmarks/system/train_phase.py --flush-denormal        # the same with denormals flushed
    .venv/bin/python benchmarks/system/train_phase.py --plain --steps 8       # the run's own calls, nothing else

Runs ``versus_trl/_ours_worker.py``'s synchronous step (the workload's vLLM engine, reference, learner, weight push)
and times the learner's ``train_step`` three ways on every step's batch, each from the same learner state (weights,
AdamW moments and schedule restored between them):

* ``run``: the call the step makes, right after generation and reference scoring (``training_seconds``);
* ``again``: the same call on the same batch at once, so every kernel, buffer and page it needs is warm;
* ``random``: the same shapes and masks with random answer ids and advantages (as ``micro/learner_levers.py``
  times ``train_step`` alone), which keeps the shapes and changes only the values.

``run`` > ``again`` is time spent getting ready for a new batch (kernels built for new shapes, memory faulted in
after the engine and the reference ran); ``again`` > ``random`` is time the values themselves cost (the kernels'
speed on the run's log-probs, such as denormal floats). Writes ``benchmarks/results/train_phase.json``.

The three calls need the learner's state copied and restored around them, and those copies (the weights and both
AdamW moments, twice a step) churn the process's heap: the calls that follow fault in memory anew for a few steps.
``--plain`` times the run's own call alone, with no copies and no repeats: what a run's training phase costs.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine, machine, set_threads  # noqa: E402
from benchmarks.common.workload import REWARD_WEIGHTS, brevity  # noqa: E402
from benchmarks.versus_trl._ours_worker import compose, workload_overrides  # noqa: E402
from benchmarks.versus_trl.trl_compare import BF16, COMMON_OURS, EAGER, FP32  # noqa: E402


def snapshot(learner) -> dict:
    """The learner's weights and its optimizer and schedule state, copied."""
    return {
        "params": [p.detach().clone() for p in learner.model.parameters()],
        "learner": copy.deepcopy(learner.state_dict()),
    }


def restore(learner, state: dict) -> None:
    import torch

    with torch.no_grad():
        for p, saved in zip(learner.model.parameters(), state["params"], strict=True):
            p.copy_(saved)
    learner.load_state_dict(copy.deepcopy(state["learner"]))


def randomised(batch, seed: int):
    """The batch's shapes and masks with random answer ids, advantages and log-probs."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = batch.clone()
    ids = out["response_ids"]
    out["response_ids"] = torch.where(
        out["response_mask"].bool(), torch.randint(100, 49152, ids.shape, generator=g), ids
    )
    out["advantage"] = torch.randn(out["advantage"].shape, generator=g)
    for key in ("behavior_logprobs", "ref_logprobs"):
        if key in out.keys():
            out[key] = -5 * torch.rand(out[key].shape, generator=g)
    return out


def timed(fn) -> tuple[float, int]:
    """Seconds and minor page faults (thousands) of ``fn()``: memory the kernel had to hand the process anew."""
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    fn()
    return time.perf_counter() - t0, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) // 1000


def fault_cost() -> dict:
    """What faulting memory in costs here: 1 GiB freshly allocated and filled against the same filled again, best of
    3; the difference per page is the price of a page fault."""
    import torch

    fresh, warm, faults = [], [], 0
    for _ in range(3):
        (seconds, faults_k) = timed(lambda: torch.empty(2**28).fill_(1.0))
        fresh.append(seconds)
        faults = faults_k
        x = torch.empty(2**28).fill_(1.0)
        warm.append(timed(lambda x=x: x.fill_(2.0))[0])
        del x
    per_page_us = (min(fresh) - min(warm)) / max(faults * 1000, 1) * 1e6
    print(
        f"1 GiB freshly faulted in and filled {min(fresh):.3f} s ({faults} thousand faults), filled again "
        f"{min(warm):.3f} s: {per_page_us:.2f} us a page fault"
    )
    return dict(fresh_s=min(fresh), warm_s=min(warm), faults_k=faults, per_fault_us=per_page_us)


class Timed:
    """``learner.train_step`` that keeps its last call's :func:`timed` figures (the run's own call)."""

    def __init__(self, learner):
        self.learner, self.step, self.last = learner, learner.train_step, (0.0, 0)
        learner.train_step = self

    def __call__(self, batch):
        out = {}
        self.last = timed(lambda: out.update(self.step(batch)))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--steps", type=int, default=4, help="timed steps, after one warm-up step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--flush-denormal", action="store_true", help="torch.set_flush_denormal(True) first")
    parser.add_argument("--plain", action="store_true", help="time the run's own call alone: no copies, no repeats")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    set_threads(args.threads)
    announce_machine()

    import torch

    from grpo_rl.engines.build import make_engine
    from grpo_rl.envs import make_env
    from grpo_rl.envs.rewards.base import RewardComponent
    from grpo_rl.rollout.collector import make_collector
    from grpo_rl.run.setup import make_run
    from grpo_rl.training.build import make_local_learner, make_ref_scorer, seed_everything
    from grpo_rl.training.step import train_on_batch

    faulting = fault_cost()
    if args.flush_denormal and not torch.set_flush_denormal(True):
        raise SystemExit("--flush-denormal: this CPU cannot flush denormals")
    precision = BF16 if args.precision == "bfloat16" else FP32
    run_dir = tempfile.mkdtemp(prefix="train_phase_")
    overrides = [*COMMON_OURS, "train.share_prompt=true", *precision, *EAGER, *args.overrides]
    cfg = compose(workload_overrides(run_dir) + overrides)
    run = make_run(cfg, run_dir)
    engine = make_engine(run)
    seed_everything(cfg.seed)
    learner = make_local_learner(run)
    ref = make_ref_scorer(run)
    env = make_env(cfg, run.tokenizer)
    env.reward.components.append(RewardComponent("brevity", brevity, REWARD_WEIGHTS["brevity"]))
    collector = make_collector(run, engine, env=env)

    rows = []
    repeats = () if args.plain else ("again", "random")
    print(
        "| step | tokens | micro-batches | run s |"
        + "".join(f" {r} s |" for r in repeats)
        + (" run / again | again / random |" if repeats else "")
        + f" page faults (k): {', '.join(('run', *repeats))} |"
    )
    print("|---:" * (4 + 2 * len(repeats)) + "|---|")
    own = Timed(learner)
    for step in range(args.steps + 1):
        batch, _ = collector.collect(step, learner.version)
        before = None if args.plain else snapshot(learner)
        batch, metrics = train_on_batch(learner, ref, batch, run.cfg.policy, run.cfg.sampling.max_new_tokens)
        seconds, faults = {"run": own.last[0]}, {"run": own.last[1]}
        if before is not None:  # the same call again, then a random batch of its shapes, each from the same state
            after = snapshot(learner)
            restore(learner, before)
            seconds["again"], faults["again"] = timed(lambda b=batch: own.step(b.clone()))
            restore(learner, before)
            shuffled = randomised(batch, step)
            seconds["random"], faults["random"] = timed(lambda s=shuffled: own.step(s))
            restore(learner, after)
        engine.update_weights(learner.weights_for_push())
        tokens = int(batch["prompt_mask"].sum() + batch["response_mask"].sum())
        row = dict(step=step, warm_up=step == 0, tokens=tokens, micro_batches=int(metrics["num_micro_batches"]))
        row.update({f"{k}_s": v for k, v in seconds.items()}, page_faults_k=faults)
        rows.append(row)
        ratios = (
            f" {seconds['run'] / seconds['again']:.2f} | {seconds['again'] / seconds['random']:.2f} |"
            if repeats
            else ""
        )
        print(
            f"| {step}{' (warm-up)' if step == 0 else ''} | {tokens} | {row['micro_batches']} |"
            + "".join(f" {v:.2f} |" for v in seconds.values())
            + ratios
            + f" {', '.join(str(f) for f in faults.values())} |",
            flush=True,
        )
    engine.shutdown()
    timed_rows = [r for r in rows if not r["warm_up"]]
    summary = {f"{k}_s": statistics.median(r[f"{k}_s"] for r in timed_rows) for k in ("run", *repeats)}
    print(f"median of {len(timed_rows)} steps: " + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in summary.items()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "train_phase.json"
    out.write_text(
        json.dumps(
            dict(
                machine=machine(), threads=args.threads, args=vars(args), rows=rows, median=summary, faulting=faulting
            ),
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
