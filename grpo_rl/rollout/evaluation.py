"""Held-out evaluation: greedy accuracy and pass@k on a fixed set of prompts.

During training (``eval.every``), and alone on a checkpoint or an exported model (:mod:`grpo_rl.cli.evaluate`).

Every evaluation answers the same prompts: the first ``eval.num_prompts`` of the held-out split in file order
(GSM8K's test split; IFEval's 541 prompts, since it has no other). An answer counts as solved when the task's
success component (GSM8K: ``correct``; IFEval: ``prompt_strict``, the benchmark's headline metric) is 1.

* ``eval/accuracy``: fraction of prompts whose greedy answer (temperature 0) is solved.
* ``eval/pass@k``: the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models Trained on
  Code", eq. 1) from ``n = eval.num_samples >= k`` answers sampled at ``eval.temperature``:
  ``pass@k = 1 - C(n - c, k) / C(n, k)`` for ``c`` solved answers, averaged over prompts. The samples use
  fixed seeds, so successive evaluations differ only through the weights.

It runs on the training engine (whose weights are the learner's after each push) through the same
:class:`~grpo_rl.rollout.collector.Collector` and environment code as training, so prompts are formatted and scored
exactly as in training.
"""

from __future__ import annotations

import copy
import logging
import time

import numpy as np
import torch
from omegaconf import OmegaConf

from grpo_rl.envs.tasks import task_of
from grpo_rl.rollout.collector import Collector

log = logging.getLogger(__name__)

_EVAL_SEED_OFFSET = 1_000_000  # keeps the pass@k sample seeds apart from the training collector's


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that ``k`` answers drawn without replacement from ``n`` (``c`` of them correct) hold a correct one."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def solved(batch, success_component: str | None) -> torch.Tensor:
    """``[N]`` bool: which answers of a scored batch count as solved."""
    if success_component is None:
        return batch["reward"] >= 1.0 - 1e-6
    key = f"reward_{success_component}"
    if key not in batch.keys():
        have = sorted(k for k in batch.keys() if isinstance(k, str) and k.startswith("reward_"))
        raise KeyError(f"eval.success_component={success_component}: the environment logs no {key} (it has {have})")
    return batch[key] >= 1.0 - 1e-6


def eval_split(cfg) -> str:
    """The held-out split: ``eval.split``, else the task's (:attr:`~grpo_rl.envs.tasks.task.Task.eval_split`), else
    ``env.split``."""
    return cfg.eval.split or task_of(cfg.env.dataset).eval_split or cfg.env.split


def success_component(cfg) -> str | None:
    """The reward component marking an answer solved: ``eval.success_component``, else the task's; None: the total
    reward >= 1."""
    return cfg.eval.success_component or task_of(cfg.env.dataset).success_component


def eval_config(cfg):
    """A copy of ``cfg`` whose ``env`` serves the held-out prompts in file order, ``eval.num_prompts`` at a time,
    read-only as ``cfg`` is."""
    ev = copy.deepcopy(cfg)
    OmegaConf.set_readonly(ev, False)  # a copy of its own to change; the run's config stays as it is
    ev.env.shuffle = False
    ev.env.prompts_per_step = cfg.eval.num_prompts
    if task_of(cfg.env.dataset).success_component is not None:
        ev.reward.model_path = None  # the success component does not need a reward model; do not load another
    OmegaConf.set_readonly(ev, OmegaConf.is_readonly(cfg))
    return ev


class Evaluator:
    """Greedy accuracy and pass@k of the engine's current weights on fixed held-out prompts.

    Args:
        env: the held-out environment (unshuffled, ``prompts_per_step`` = prompts per evaluation).
        pass_k: k (0: no sampled pass); ``num_samples`` (>= ``pass_k``) answers are sampled per prompt.
        success_component: reward component marking a solved answer; None: total reward >= 1.
        every: evaluate in :meth:`maybe_evaluate` every this many steps (0: never).
    """

    def __init__(
        self,
        env,
        engine,
        tokenizer,
        *,
        pass_k: int,
        num_samples: int | None,
        temperature: float,
        max_new_tokens: int,
        success_component: str | None,
        seed: int = 0,
        every: int = 0,
        max_turns: int = 1,
        max_total_tokens: int = 1 << 30,
    ):
        self.env = env
        self.pass_k = pass_k
        self.num_samples = num_samples or pass_k
        self.success_component = success_component
        self.every = every
        # Episodes as in training: with the environment's tools, over up to max_turns turns.
        episodes = dict(tools=env.tool_use, max_turns=max_turns, max_total_tokens=max_total_tokens)
        self.greedy = Collector(
            env,
            engine,
            tokenizer,
            group_size=1,
            max_new_tokens=max_new_tokens,
            temperature=0.0,
            seed=seed + _EVAL_SEED_OFFSET,
            **episodes,
        )
        self.sampled = None
        if pass_k > 0:
            self.sampled = Collector(
                env,
                engine,
                tokenizer,
                group_size=self.num_samples,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed + _EVAL_SEED_OFFSET,
                **episodes,
            )
        self.last_answers: list[dict] = []

    def _rewind(self) -> None:
        self.env.load_state_dict({"epoch": 0, "position": 0, "seed": self.env.seed})

    def evaluate(self) -> dict[str, float]:
        """Evaluate once; returns ``eval/...`` metrics."""
        t0 = time.perf_counter()
        self._rewind()
        batch, _ = self.greedy.collect(0, 0)
        ok = solved(batch, self.success_component)  # [P]
        metrics = {
            "eval/accuracy": float(ok.float().mean()),
            "eval/reward_mean": float(batch["reward"].mean()),
            "eval/num_prompts": float(batch.batch_size[0]),
        }
        for key in batch.keys():
            if isinstance(key, str) and key.startswith("reward_"):
                metrics[f"eval/{key}_mean"] = float(batch[key].float().mean())
        metrics["eval/response_length_mean"] = float(batch["response_mask"].sum(-1).float().mean())
        metrics["eval/truncated_fraction"] = float(batch["truncated"].float().mean())
        self.last_answers = [
            {"prompt": batch["prompt"][i], "response": batch["response_text"][i], "solved": bool(ok[i])}
            for i in range(batch.batch_size[0])
        ]
        if self.sampled is not None:
            self._rewind()
            samples, _ = self.sampled.collect(0, 0)
            _, group_N = torch.unique(samples["group_id"], return_inverse=True)  # [N] a prompt's answers
            count_P = torch.bincount(group_N)  # [P]
            correct_P = torch.bincount(group_N, weights=solved(samples, self.success_component).double())  # [P]
            metrics[f"eval/pass@{self.pass_k}"] = float(
                np.mean(
                    [
                        pass_at_k(int(n), int(c), self.pass_k)
                        for n, c in zip(count_P.tolist(), correct_P.tolist(), strict=True)
                    ]
                )
            )
            metrics["eval/sample_accuracy"] = float(correct_P.sum() / count_P.sum())
        metrics["eval/seconds"] = time.perf_counter() - t0
        return metrics

    def maybe_evaluate(self, step: int, last_step: int) -> dict[str, float]:
        """:meth:`evaluate` when ``step`` is a multiple of ``every`` or the last step; else nothing."""
        if not due_for_evaluation(self.every, step, last_step):
            return {}
        metrics = self.evaluate()
        log.info(
            "eval at step %d: %s",
            step,
            "  ".join(
                f"{k[5:]} {v:.3f}" for k, v in metrics.items() if k in ("eval/accuracy", f"eval/pass@{self.pass_k}")
            ),
        )
        return metrics


def due_for_evaluation(every: int, step: int, last_step: int) -> bool:
    """``eval.every``: evaluate after every ``every``-th step and after the last one (never when 0)."""
    return bool(every) and (step % every == 0 or step == last_step)


def make_eval_env(run, *, every: int | None = None):
    """The held-out environment ``cfg.eval`` asks for, read and checked before any engine starts; None when
    ``eval.every`` is 0 (and ``every`` not given)."""
    cfg = run.cfg
    if not (cfg.eval.every if every is None else every):
        return None
    from grpo_rl.envs import make_env

    return make_env(
        eval_config(cfg),
        run.tokenizer,
        split=eval_split(cfg),
        devices=run.devices,
        fewer_prompts_ok=True,
        rewards=run.rewards,
    )


def make_evaluator(run, engine, *, every: int | None = None, env=None) -> Evaluator | None:
    """The evaluator ``cfg.eval`` asks for, on ``engine`` and ``env`` (default: :func:`make_eval_env`); None when
    ``eval.every`` is 0 (and ``every`` not given)."""
    cfg = run.cfg
    in_training = every is None
    every = cfg.eval.every if in_training else every
    if not every:
        return None
    env = env if env is not None else make_eval_env(run, every=every)
    split, success = eval_split(cfg), success_component(cfg)
    log.info(
        "evaluation: %d %s/%s prompts (success: %s)%s",
        min(len(env), cfg.eval.num_prompts),
        cfg.env.dataset,
        split,
        f"reward_{success}" if success else "total reward >= 1",
        f", every {every} steps" if in_training else "",
    )
    if len(env) < cfg.eval.num_prompts:
        env.prompts_per_step = len(env)
    return Evaluator(
        env,
        engine,
        run.tokenizer,
        pass_k=cfg.eval.pass_k,
        num_samples=cfg.eval.num_samples,
        temperature=cfg.eval.temperature,
        max_new_tokens=cfg.eval.max_new_tokens or cfg.sampling.max_new_tokens,
        success_component=success,
        seed=cfg.seed,
        every=every,
        max_turns=cfg.env.max_turns,
        max_total_tokens=cfg.inference_model.max_model_len,
    )
