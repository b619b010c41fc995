"""DAPO's dynamic sampling, group by group: which groups vary, a flat group replaced the moment it finishes, the
bound on groups drawn, the metrics, how groups of different padding are joined, and that every group drawn is
consumed exactly once (the synchronous source; the asynchronous buffer's part is in tests/unit/distributed)."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from grpo_rl.engines.base import concat_batches
from grpo_rl.rollout.dynamic_sampling import DynamicSampling, varied_groups
from grpo_rl.rollout.source import InProcessRollouts
from tests.unit.rollout.streams import StreamingCollector, make_group

G = 2  # answers per group


def make_batch(
    rewards_per_group: list[list[float]], *, prompt_len: int = 3, answer_len: int = 2, index: int = 0
) -> TensorDict:
    """Groups of G answers with the given rewards; prompts left-padded, answers right-padded to the given widths
    (each row's real prompt is 2 tokens, its answer 1 token)."""
    n = len(rewards_per_group) * G
    prompt_ids = torch.zeros(n, prompt_len, dtype=torch.long)
    prompt_ids[:, -2:] = torch.tensor([11, 12])
    prompt_mask = (prompt_ids != 0).long()
    response_ids = torch.zeros(n, answer_len, dtype=torch.long)
    response_ids[:, 0] = 7
    response_mask = (response_ids != 0).long()
    return TensorDict(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "behavior_logprobs": -response_mask.float(),
            "group_id": torch.arange(n) // G,
            "truncated": torch.zeros(n, dtype=torch.bool),
            "reward": torch.tensor([float(r) for group in rewards_per_group for r in group]),
            "reward_correct": torch.tensor([float(r) for group in rewards_per_group for r in group]),
            "batch_index": torch.full((n,), index),
            "response_text": NonTensorStack(*[f"b{index}r{i}" for i in range(n)]),
        },
        batch_size=[n],
    )


def test_varied_groups_marks_whole_groups_whose_rewards_differ():
    batch = make_batch([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, 0.25]])
    assert varied_groups(batch).tolist() == [False, False, True, True, False, False, True, True]


def _source(rewards, *, P=2, extra_rounds=3, **kwargs):
    collector = StreamingCollector(rewards, prompts_per_step=P, **kwargs)
    return InProcessRollouts(collector, dynamic=DynamicSampling(groups=P, max_extra_rounds=extra_rounds)), collector


def test_a_flat_group_is_replaced_as_it_finishes_and_never_more_than_p_are_in_flight():
    varied = {2, 4, 7}
    source, collector = _source(lambda g: [0.0, 1.0] if g in varied else [1.0, 1.0])
    rollout = source.next_batch(0)
    assert rollout.batch["group_index"].tolist() == [2, 2, 4, 4]  # in stream order
    assert collector.drawn == [0, 1, 2, 3, 4] and collector.most_in_flight == 2  # one refill per flat group
    m = rollout.metrics
    assert (m["sampling_rounds"], m["dynamic_sampling_groups"], m["dynamic_sampling_dropped_groups"]) == (2.5, 2, 3)
    assert m["dynamic_sampling_short"] == 0.0 and m["reward_mean_trained"] == 0.5
    assert m["reward_mean"] == pytest.approx((4 * 0.5 + 6 * 1.0) / 10)  # every answer sampled for the step
    assert source.state_dict()["next_group"] == 5  # all five consumed, the dropped ones too
    following = source.next_batch(1)  # from group 5 on, only 7 varies: short after (1 + 3) * P draws
    assert following.batch["group_index"].tolist() == [7, 7] and collector.drawn[5:] == list(range(5, 13))


def test_the_bound_on_draws_ends_the_step_short_with_what_varies():
    source, collector = _source(lambda g: [0.0, 1.0] if g == 1 else [0.0, 0.0], extra_rounds=1)
    rollout = source.next_batch(0)
    assert collector.drawn == [0, 1, 2, 3]  # (1 + 1) * P draws at most
    assert rollout.batch["group_index"].tolist() == [1, 1]
    assert rollout.metrics["dynamic_sampling_short"] == 1.0 and rollout.metrics["dynamic_sampling_groups"] == 1


def test_no_varied_group_hands_on_the_first_flat_ones():
    source, _ = _source(lambda g: [1.0, 1.0], extra_rounds=1)
    rollout = source.next_batch(0)
    assert rollout.batch["group_index"].tolist() == [0, 0, 1, 1]
    assert rollout.metrics["dynamic_sampling_groups"] == 0 and math.isnan(rollout.metrics["reward_mean_trained"])


def test_groups_that_finish_out_of_order_are_trained_in_stream_order_and_resume_after_them():
    reverse = lambda drawn: drawn[::-1]  # noqa: E731 - the last drawn finishes first
    source, _ = _source(lambda g: [0.0, 1.0] if g % 3 else [1.0, 1.0], order=reverse)
    first = source.next_batch(0)
    assert first.batch["group_index"].tolist() == [1, 1, 2, 2]
    state = source.state_dict()
    assert state["next_group"] == 3 and state["consumed_groups"] == []
    resumed, collector = _source(lambda g: [0.0, 1.0], order=reverse)
    resumed.load_state_dict(state)
    assert resumed.next_batch(1).batch["group_index"].tolist() == [3, 3, 4, 4]
    assert collector.prompts == [3, 4]  # the prompts of the stream's groups 3 and 4: the env was moved there


def test_step_batch_trains_the_varied_groups_and_counts_the_flat_ones():
    kept = [make_group(0, [0.0, 1.0]), make_group(3, [1.0, 0.0], answer_len=4)]
    flat = [make_group(1, [1.0, 1.0]), make_group(2, [0.0, 0.0])]
    batch, m = DynamicSampling(groups=2, max_extra_rounds=3).step_batch(kept, flat, pad_id=0)
    assert batch["group_id"].tolist() == [0, 0, 1, 1] and batch["response_ids"].shape == (4, 4)
    assert (m["sampling_rounds"], m["dynamic_sampling_dropped_groups"], m["dynamic_sampling_short"]) == (2.0, 2, 0.0)


def test_concat_pads_prompts_left_and_answers_right():
    a = make_batch([[1, 0]], prompt_len=2, answer_len=1, index=0)
    b = make_batch([[1, 0]], prompt_len=4, answer_len=3, index=1)
    joined = concat_batches([a, b], pad_id=0)
    assert joined["prompt_ids"].shape == (4, 4) and joined["response_ids"].shape == (4, 3)
    assert joined["prompt_ids"][0].tolist() == [0, 0, 11, 12]
    assert joined["prompt_mask"][0].tolist() == [0, 0, 1, 1]
    assert joined["response_ids"][0].tolist() == [7, 0, 0]
    assert joined["behavior_logprobs"][0].tolist() == [-1.0, 0.0, 0.0]
    assert joined["group_id"].tolist() == [0, 0, 1, 1]
    assert list(joined["response_text"]) == ["b0r0", "b0r1", "b1r0", "b1r1"]
