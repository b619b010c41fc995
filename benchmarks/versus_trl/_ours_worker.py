"""Our side of ``trl_compare.py``: the synchronous GRPO step of ``sota/grpo.py``, one step per 'step' command.

    python benchmarks/versus_trl/_ours_worker.py --prompts P.json --threads 2 [hydra overrides ...]

Builds every component through the same ``make_*`` factories as ``sota/grpo.py`` and runs its step
(collect -> reference + advantages -> train -> push weights), timing each phase. Emits protocol lines (see
``benchmarks/common/workload.py``). Run by the orchestrator, not by hand.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

if "--torch-first" in sys.argv:  # measure the OpenMP runtime's own defaults: torch loads before grpo_rl sets ours
    importlib.import_module("torch")
from benchmarks.common import ROOT  # noqa: E402
from benchmarks.common.machine import peak_rss_gib, set_threads  # noqa: E402
from benchmarks.common.workload import REWARD_WEIGHTS, WORKLOAD, brevity, emit, wait_for_command  # noqa: E402
from grpo_rl import OPENMP_DEFAULTS  # noqa: E402  (sets our OpenMP defaults, unless torch is already loaded)


def workload_overrides(run_dir: str) -> list[str]:
    w = WORKLOAD
    return [
        f"seed={w['seed']}",
        f"output_dir={run_dir}",
        f"model.name={w['model']}",
        "model.dtype=float32",
        "env.dataset=gsm8k",
        "env.split=train",
        "env.template=hash",
        f"env.prompts_per_step={w['prompts_per_step']}",
        f"env.group_size={w['group_size']}",
        f"sampling.max_new_tokens={w['max_new_tokens']}",
        f"sampling.temperature={w['temperature']}",
        "sampling.top_p=1.0",
        f"policy.kl_coef={w['kl_coef']}",
        f"optimizer.lr={w['lr']}",
        "optimizer.warmup_steps=0",
        f"reward.correctness_weight={REWARD_WEIGHTS['correct']}",
        f"reward.format_weight={REWARD_WEIGHTS['format']}",
        "logger.backend=none",
        "train.steps=1000",
    ]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from grpo_rl.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "config"), version_base="1.3"):
        return hydra_compose(config_name="grpo_gsm8k", overrides=overrides)


def group_stats(batch) -> list[list[int]]:
    """``[[prompt_len, answer_len, ...], ...]`` per group: what the FLOP accounting needs."""
    p_len = batch["prompt_mask"].sum(-1).tolist()
    r_len = batch["response_mask"].sum(-1).tolist()
    gid = batch["group_id"].tolist()
    groups: dict[int, list[int]] = {}
    for g, p, r in zip(gid, p_len, r_len, strict=True):
        groups.setdefault(g, [int(p)]).append(int(r))
    return list(groups.values())


def numerics_check(learner, ref, batch) -> dict:
    """On the warm-up batch (policy == reference): packed vs unpacked reference log-probs, and engine vs learner."""
    import torch

    from grpo_rl.model.logprobs import sequence_logprobs

    view = batch.select("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_id")
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        packed = sequence_logprobs(ref.model, view, share_prompt=True).logprobs
        unpacked = sequence_logprobs(ref.model, view, share_prompt=False).logprobs
    out = {"packed_vs_unpacked_max_abs": float((packed - unpacked)[mask].abs().max())}
    out["engine_vs_ref_mean_abs"] = float((batch["behavior_logprobs"] - batch["ref_logprobs"])[mask].abs().mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", required=True, help="JSON list of the prompts each step must see, in order")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--torch-first", action="store_true", help="load torch before grpo_rl (see the imports)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    set_threads(args.threads)
    t_start = time.perf_counter()

    import torch

    from grpo_rl.algo.advantages import group_advantages
    from grpo_rl.engines.build import make_engine
    from grpo_rl.envs import make_env
    from grpo_rl.envs.rewards.base import RewardComponent
    from grpo_rl.rollout.collector import make_collector
    from grpo_rl.run.setup import make_run
    from grpo_rl.training.build import make_local_learner, make_ref_scorer, seed_everything
    from grpo_rl.training.step import train_on_batch

    run_dir = tempfile.mkdtemp(prefix="trl_compare_ours_")
    cfg = compose(workload_overrides(run_dir) + list(args.overrides))
    run = make_run(cfg, run_dir)
    shared = cfg.inference_model.share_weights  # the lowmem preset: the engine generates with the learner's model
    engine = None if shared else make_engine(run)
    seed_everything(cfg.seed)
    learner = make_local_learner(run)
    if shared:
        engine = make_engine(run, policy=learner.model)
    ref = make_ref_scorer(run)
    env = make_env(cfg, run.tokenizer)
    env.reward.components.append(RewardComponent("brevity", brevity, REWARD_WEIGHTS["brevity"]))
    collector = make_collector(run, engine, env=env)
    expected = [p["prompt_index"] for p in json.loads(Path(args.prompts).read_text())]
    emit(
        "ready",
        startup_s=time.perf_counter() - t_start,
        torch_threads=torch.get_num_threads(),
        openmp={k: os.environ.get(k) for k in OPENMP_DEFAULTS},
        config={k: v for k, v in (o.split("=", 1) for o in args.overrides)},
    )

    step = 0
    while wait_for_command() == "step":
        t0 = time.perf_counter()
        batch, cs = collector.collect(step, learner.version)
        rewards = batch["reward"].clone()
        batch, metrics = train_on_batch(learner, ref, batch, run.cfg.policy, run.cfg.sampling.max_new_tokens)
        t3 = time.perf_counter()
        engine.update_weights(learner.named_weights())
        t4 = time.perf_counter()
        extra = numerics_check(learner, ref, batch) if step == 0 else {}
        prompt_of_group = dict(zip(batch["group_id"].tolist(), batch["prompt_index"].tolist(), strict=True))
        seen = [prompt_of_group[g] for g in sorted(prompt_of_group)]
        want = expected[step * cfg.env.prompts_per_step : (step + 1) * cfg.env.prompts_per_step]
        emit(
            "step",
            step=step,
            seconds=t4 - t0,
            generation_s=cs.generation_seconds,
            reward_s=cs.reward_seconds,
            reference_s=metrics["reference_seconds"],
            training_s=metrics["training_seconds"],
            weight_sync_s=t4 - t3,
            completion_tokens=int(batch["response_mask"].sum()),
            grad_norm=metrics["grad_norm"],
            reward_mean=float(rewards.mean()),
            reward_std_within_groups=float(group_advantages(rewards, batch["group_id"]).group_std.mean()),
            kl_ref=metrics.get("kl_ref", float("nan")),
            groups=group_stats(batch),
            prompts_match=seen == want,
            peak_rss_gib=peak_rss_gib(),
            **extra,
        )
        step += 1
    engine.shutdown()
    emit("done", peak_rss_gib=peak_rss_gib())
    os._exit(0)  # skip interpreter teardown of vLLM's threads


if __name__ == "__main__":
    sys.exit(main())
