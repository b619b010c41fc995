"""DAPO's dynamic sampling: draw batches until the step holds ``env.prompts_per_step`` groups whose rewards vary.

A group whose answers all got the same reward has zero advantage everywhere and carries no gradient; dropping it
(``policy.filter_zero_variance_groups``) leaves the step with fewer groups, and fewer still as the model gets
better or worse at everything. DAPO (Yu et al., 2025, section 3.2) instead keeps sampling: with
``policy.dynamic_sampling=true`` :class:`DynamicSampling` asks the rollout source for more batches (each the next
batch of the prompt stream, seeded as its own index, so runs and resumes are reproducible) until it has
``prompts_per_step`` groups whose task reward (``reward``, before any length shaping or KL) varies, at most
``policy.dynamic_sampling_max_rounds`` batches beyond the first. The varied groups are kept in the order drawn and
cut to ``prompts_per_step`` (verl does the same); when the bound is reached first, the step trains on the varied
groups it has (``dynamic_sampling_short`` is 1), and on none if there are none (the update is skipped). Dynamic
sampling implies the zero-variance filter (``policy.filter_zero_variance_groups``).

It wraps either loop's :class:`~grpo_rl.rollout.source.RolloutSource`: every batch drawn is consumed (trained on in
part, or dropped), so the stream position and a resumed run stay exactly once. In the asynchronous loop each
extra batch comes from the buffer and passes the staleness gate like any other.

Logged every step: ``sampling_rounds`` (batches drawn), ``dynamic_sampling_groups`` (varied groups trained),
``dynamic_sampling_dropped_groups`` (flat groups, plus varied ones beyond ``prompts_per_step``),
``dynamic_sampling_short``. ``reward_mean`` and the other reward statistics are those of every answer sampled in
the step (all rounds), so runs with and without dynamic sampling log comparable rewards; ``reward_mean_trained``
is the mean over the answers trained on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict

from grpo_rl.engines.base import concat_batches
from grpo_rl.rollout.source import Rollout
from grpo_rl.rollout.stats import batch_metrics

# Metrics of one round that add up over the rounds of a step; ``*_max`` take the maximum; the rest are averaged
# over the rounds, weighted by their rows.
_SUMMED = ("_seconds", "reward_failures", "dropped_samples")


def varied_groups(batch: TensorDict) -> torch.Tensor:
    """``[N]`` bool: rows whose group's task rewards are not all equal."""
    reward, group = batch["reward"], batch["group_id"]
    groups, inverse = torch.unique(group, return_inverse=True)
    lo = torch.full((len(groups),), float("inf")).scatter_reduce(0, inverse, reward.float(), "amin")
    hi = torch.full((len(groups),), float("-inf")).scatter_reduce(0, inverse, reward.float(), "amax")
    return (hi > lo)[inverse]


def _first_groups(batch: TensorDict, count: int) -> TensorDict:
    """The rows of ``batch``'s first ``count`` groups (in row order)."""
    seen: dict[int, None] = {}
    for g in batch["group_id"].tolist():
        seen.setdefault(g, None)
    keep = torch.tensor(list(seen)[:count])
    return batch[torch.isin(batch["group_id"], keep)]


def combine_round_metrics(rounds: list[tuple[dict, int]]) -> dict[str, float]:
    """One step's rollout metrics from its rounds' ``(metrics, rows)``: sums, maxima, row-weighted means."""
    out: dict[str, float] = {}
    for key in {k for m, _ in rounds for k in m}:
        values = [(m[key], n) for m, n in rounds if key in m]
        if key.endswith(_SUMMED):
            out[key] = float(sum(v for v, _ in values))
        elif key.endswith("_max"):
            out[key] = float(max(v for v, _ in values))
        else:
            out[key] = float(sum(v * n for v, n in values) / max(1, sum(n for _, n in values)))
    return out


class DynamicSampling:
    """A rollout source that draws from ``source`` until a step has ``groups`` (``env.prompts_per_step``) groups
    with varied rewards, in at most ``max_extra_rounds`` batches beyond the first; evaluation, checkpoints and
    closing go to ``source``, and ``pad_id`` pads the rounds' batches to a common width."""

    def __init__(self, source, *, groups: int, max_extra_rounds: int, pad_id: int):
        self.source = source
        self.groups = groups
        self.max_extra_rounds = max_extra_rounds
        self.pad_id = pad_id

    def next_batch(self, version: int, should_stop: Callable[[], bool] = lambda: False) -> Rollout | None:
        kept, drawn, rounds, failures = [], [], [], []
        num_varied = 0
        for _ in range(1 + self.max_extra_rounds):
            rollout = self.source.next_batch(version, should_stop)
            if rollout is None:  # stopped while waiting (asynchronous loop): the run ends
                return None
            batch = rollout.batch
            drawn.append(batch)
            rounds.append((rollout.metrics, batch.batch_size[0]))
            failures.extend(rollout.failure_examples)
            varied = varied_groups(batch)
            if bool(varied.any()):
                kept.append(batch[varied])
                num_varied += len(torch.unique(batch["group_id"][varied]))
            if num_varied >= self.groups:
                break
        every = concat_batches(drawn, self.pad_id)
        total_groups = len(torch.unique(every["group_id"]))
        # No varied group at all: the first round's flat groups, which the zero-variance filter then drops (the
        # update is skipped) after the batch metrics are taken.
        batch = _first_groups(concat_batches(kept, self.pad_id) if kept else drawn[0], self.groups)
        trained_groups = min(num_varied, self.groups)
        metrics = combine_round_metrics(rounds)
        metrics.update({k: v for k, v in batch_metrics(every).items() if k.startswith("reward")})
        metrics.update(
            sampling_rounds=float(len(drawn)),
            dynamic_sampling_groups=float(trained_groups),
            dynamic_sampling_dropped_groups=float(total_groups - trained_groups),
            dynamic_sampling_short=float(trained_groups < self.groups),
            reward_mean_trained=float(batch["reward"].mean()) if kept else float("nan"),
        )
        return Rollout(batch=batch, metrics=metrics, failure_examples=failures)

    def state_dict(self) -> dict:
        return self.source.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.source.load_state_dict(state)

    def rewind(self) -> None:
        self.source.rewind()

    def evaluate(self, step: int, last_step: int) -> dict[str, float]:
        return self.source.evaluate(step, last_step)

    def close(self) -> None:
        self.source.close()
