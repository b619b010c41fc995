"""Reward curves of the objectives on the embedded default: grpo, dapo with dynamic sampling, gspo, cispo, sapo,
gmpo and grpo with IcePop's engine band mask; and of the ``lowmem`` preset against the default.

    python benchmarks/learning/objectives_curve.py                    # 20 steps each, SmolLM2-135M-Instruct on GSM8K
    python benchmarks/learning/objectives_curve.py --steps 30 --arms grpo,cispo --json /tmp/curves.json
    python benchmarks/learning/objectives_curve.py -- sampling.max_new_tokens=96   # extra Hydra overrides: every arm

Each arm is ``sota/grpo.py`` on the embedded default (config/grpo_gsm8k.yaml: 4 prompts x 8 answers per step, the
same seed, so the same prompt stream and sampling seeds) with only the objective changed, run one after the other
in a subprocess. Reported per arm: mean reward of the first 5 and of the last 10 steps, the mean reward over all
steps, wall time (model loading included), seconds per step and the run's peak RSS (``ru_maxrss`` of its process). With
dynamic sampling a step may draw several batches of prompts (``sampling_rounds``), so that arm sees more prompts and
takes longer per step; its ``reward_mean`` is over every answer it sampled, like the others'.

The arms:

* ``grpo``: ``policy.loss_type=grpo`` (the default: clipped surrogate, token-mean aggregation).
* ``dapo_dyn``: ``policy.loss_type=dapo policy.dynamic_sampling=true`` (token-mean, clip-higher 0.28 as the default,
  dynamic sampling with up to 3 extra batches).
* ``gspo``: ``policy.loss_type=gspo`` with the paper's clip range (3e-4, 4e-4).
* ``cispo``: ``policy.loss_type=cispo`` (weights cut at 5).
* ``sapo``: ``policy.loss_type=sapo`` (TRL's gate temperatures 1.0 / 1.05, per-answer token mean).
* ``gmpo``: ``policy.loss_type=gmpo`` (token log-ratios clipped to +-0.4, mean over answers).
* ``icepop``: grpo with ``policy.engine_correction=token_band_mask`` and IcePop's band [0.5, 5].
* ``lowmem``: ``+preset=lowmem`` (config/preset/lowmem.yaml), the grpo objective: ``--arms grpo,lowmem``.

With one optimizer step per batch (``train.updates_per_batch=1``, the default) every ratio is 1 at the update, so
grpo, gspo and cispo differ only in how the loss is aggregated and weighted: gspo averages per answer; cispo's
gradient is REINFORCE's. At ratio 1 SAPO's gate passes the whole gradient and GMPO's geometric mean is 1, so sapo and
gmpo give gspo's gradient (the per-answer mean of REINFORCE's); pass ``-- train.updates_per_batch=2`` to make them
differ. The icepop arm differs from grpo only where the engine's log-probs leave the band. The curves of one seed
are noisy: differences of a few hundredths are not evidence.

Prints the CPU, its flags and the load average before each arm, a table, and writes JSON. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine  # noqa: E402
from benchmarks.common.runner import run_script  # noqa: E402

ARMS = {
    "grpo": ["policy.loss_type=grpo"],
    "dapo_dyn": ["policy.loss_type=dapo", "policy.dynamic_sampling=true"],
    "gspo": ["policy.loss_type=gspo", "policy.clip_eps_low=3e-4", "policy.clip_eps_high=4e-4"],
    "cispo": ["policy.loss_type=cispo"],
    "sapo": ["policy.loss_type=sapo"],
    "gmpo": ["policy.loss_type=gmpo"],
    "icepop": [
        "policy.engine_correction=token_band_mask",
        "policy.engine_correction_min=0.5",
        "policy.engine_correction_max=5.0",
    ],
    "lowmem": ["+preset=lowmem"],
}


def run_arm(name: str, overrides: list[str], run_dir: Path, timeout: float) -> dict:
    load = os.getloadavg()
    run_dir.mkdir(parents=True, exist_ok=True)
    run = run_script("grpo.py", overrides, run_dir=run_dir, log=run_dir.parent / f"{name}.log", timeout=timeout)
    steps = [r for r in run.rows if "reward_mean" in r]
    rewards = [r["reward_mean"] for r in steps]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    out = {
        "arm": name,
        "overrides": overrides,
        "steps": len(steps),
        "wall_seconds": run.seconds,
        "seconds_per_step": mean([r["step_seconds"] for r in steps]),
        "reward_first5": mean(rewards[:5]),
        "reward_last10": mean(rewards[-10:]),
        "reward_all": mean(rewards),
        "rewards": rewards,
        "load_before": load,
        "peak_rss_gib": run.peak_rss_gib,
    }
    if any("sampling_rounds" in r for r in steps):
        out["sampling_rounds_mean"] = mean([r["sampling_rounds"] for r in steps])
        out["short_steps"] = sum(int(r.get("dynamic_sampling_short", 0)) for r in steps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out-dir", type=Path, default=None, help="run folders (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=RESULTS / "objectives_curve.json")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every arm (after --)")
    args = parser.parse_args()

    from grpo_rl.model.precision import cpu_flags

    announce_machine()
    base = args.out_dir or Path(f"/tmp/objectives_curve_{int(time.time())}")
    common = [
        f"train.steps={args.steps}",
        "train.max_time_minutes=null",
        "logger.backend=none",
        "eval.every=0",
        *args.overrides,
    ]
    results = []
    for name in args.arms.split(","):
        print(f"{name}: load average {os.getloadavg()[0]:.2f} before the run", flush=True)
        r = run_arm(name, [*common, *ARMS[name]], base / name, args.timeout)
        results.append(r)
        print(
            f"{name}: {r['steps']} steps in {r['wall_seconds'] / 60:.1f} min, reward first 5 {r['reward_first5']:.3f}"
            f" -> last 10 {r['reward_last10']:.3f}, peak RSS {r['peak_rss_gib']:.2f} GiB",
            flush=True,
        )

    print(
        "\n| arm | steps | reward, first 5 steps | reward, last 10 steps | all steps | wall time | s/step | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        extra = f" ({r['sampling_rounds_mean']:.2f} batches/step)" if "sampling_rounds_mean" in r else ""
        print(
            f"| {r['arm']}{extra} | {r['steps']} | {r['reward_first5']:.3f} | {r['reward_last10']:.3f} | "
            f"{r['reward_all']:.3f} | {r['wall_seconds'] / 60:.1f} min | {r['seconds_per_step']:.1f} | "
            f"{r['peak_rss_gib']:.2f} GiB |"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"cpu": cpu_flags(), "cores": os.cpu_count(), "steps": args.steps, "overrides": common, "arms": results},
            indent=2,
        )
    )
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
