"""The learner's half of a step, the same in both loops: reference scoring, advantages, the update.

A step of GRPO (Shao et al., 2024, "DeepSeekMath", Algorithm 1) after its batch is collected: score the answers
with the reference policy (when the KL penalty is on and the reference runs here), turn the rewards into
group-relative advantages (:func:`~grpo_rl.algo.advantages.assign_advantages`, with the configured filters and
shaping), and take ``train.updates_per_batch`` optimizer steps (:meth:`LearnerProtocol.train_step`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tensordict import TensorDict

from grpo_rl import trace
from grpo_rl.algo.advantages import assign_advantages
from grpo_rl.config.schema import PolicyConfig
from grpo_rl.rollout.stats import batch_metrics
from grpo_rl.training.protocols import LearnerProtocol, ReferenceScorer


def score_batch(
    batch: TensorDict, ref: ReferenceScorer | None, policy: PolicyConfig, max_new_tokens: int
) -> tuple[TensorDict, dict[str, float]]:
    """Reference scoring and advantages: the stages between collection and training, shared by both loops.
    Returns the batch the filters leave and the advantage statistics."""
    if ref is not None:
        ref.score(batch)
    return assign_advantages(
        batch,
        scale_by_std=policy.scale_advantages_by_std,
        advantage_eps=policy.advantage_eps,
        kl_in_reward_coef=policy.kl_coef if policy.kl_in_reward else 0.0,
        kl_estimator=policy.kl_estimator,
        filter_zero_variance=policy.filter_zero_variance_groups or policy.dynamic_sampling,
        overlong_buffer=policy.overlong_buffer,
        overlong_penalty=policy.overlong_penalty,
        max_tokens=max_new_tokens,
        filter_overlong=policy.overlong_filter,
    )


def train_on_batch(
    learner: LearnerProtocol,
    ref: ReferenceScorer | None,
    batch: TensorDict,
    policy: PolicyConfig,
    max_new_tokens: int,
    between_phases: Callable[[str], None] | None = None,
) -> tuple[TensorDict, dict[str, float]]:
    """The learner's half of a step, the same in both loops: :func:`score_batch`, then one
    :meth:`~grpo_rl.training.learner.Learner.train_step` on the rows the filters leave; returns the batch as trained
    and the step's metrics (``answer_tokens`` counted before filtering, each pass's seconds and tokens/s).
    ``between_phases(name)`` runs between the two and may raise to abandon the step
    (:meth:`grpo_rl.run.stopping.Stopper.between_phases`)."""
    if learner.compiled and ref is not None:
        ref.compile()  # the reference follows the learner's train.compile decision (no-op once compiled)
    metrics = batch_metrics(batch)
    answer_tokens = int(batch["response_mask"].sum())
    scored_tokens = int(batch["prompt_mask"].sum()) + answer_tokens
    t0 = time.perf_counter()
    with trace.span("reference" if ref is not None else "advantages"):
        batch, adv_stats = score_batch(batch, ref, policy, max_new_tokens)
    t1 = time.perf_counter()
    if between_phases is not None:
        between_phases("reference scoring")
    trained_tokens = 0
    if batch.batch_size[0] > 0:
        with trace.span("train", rows=batch.batch_size[0]):
            metrics.update(learner.train_step(batch))
        trained_tokens = int(batch["prompt_mask"].sum() + batch["response_mask"].sum())
    t2 = time.perf_counter()
    metrics.update(adv_stats)
    metrics.update(
        answer_tokens=answer_tokens,
        reference_seconds=t1 - t0,
        training_seconds=t2 - t1,
        training_tokens_per_second=trained_tokens / max(t2 - t1, 1e-9),
    )
    learner.observe_step(t2 - t0)  # train.compile=auto decides from these seconds
    if ref is not None:
        metrics["reference_tokens_per_second"] = scored_tokens / max(t1 - t0, 1e-9)
    return batch, metrics
