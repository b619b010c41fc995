"""DAPO's dynamic sampling: which groups vary, how rounds are drawn, cut and bounded, how batches of different
padding are joined, and that every drawn batch is consumed exactly once."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from grpo_rl.engines.base import concat_batches
from grpo_rl.rollout.dynamic_sampling import DynamicSampling, combine_round_metrics, varied_groups
from grpo_rl.rollout.source import InProcessRollouts, Rollout

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


class ScriptedSource:
    """Hands out the given batches in order, as a rollout source does, and records what it was asked."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.calls = 0

    def next_batch(self, version, *args):
        batch = self.batches[self.calls]
        self.calls += 1
        return Rollout(
            batch=batch,
            metrics={"generation_seconds": 1.0, "staleness_max": float(self.calls)},
            failure_examples=[{"call": self.calls}],
        )


def test_varied_groups_marks_whole_groups_whose_rewards_differ():
    batch = make_batch([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, 0.25]])
    assert varied_groups(batch).tolist() == [False, False, True, True, False, False, True, True]


def test_draws_until_enough_varied_groups_and_cuts_to_prompts_per_step():
    rounds = [
        make_batch([[1, 1], [0, 1]], index=0),  # 1 varied
        make_batch([[0, 0], [0, 0]], index=1),  # 0 varied
        make_batch([[1, 0], [0, 1]], index=2),  # 2 varied: 3 in all, 2 wanted
        make_batch([[1, 0], [1, 0]], index=3),
    ]  # never drawn
    source = ScriptedSource(rounds)
    rollout = DynamicSampling(source, groups=2, max_extra_rounds=5, pad_id=0).next_batch(0)
    assert source.calls == 3
    batch = rollout.batch
    assert batch["batch_index"].tolist() == [0, 0, 2, 2]  # the varied group of round 0, the first of round 2
    assert list(batch["response_text"]) == ["b0r2", "b0r3", "b2r0", "b2r1"]
    assert len(set(batch["group_id"].tolist())) == 2
    m = rollout.metrics
    assert m["sampling_rounds"] == 3 and m["dynamic_sampling_groups"] == 2 and m["dynamic_sampling_short"] == 0
    assert m["dynamic_sampling_dropped_groups"] == 4  # 6 groups drawn, 2 trained
    assert m["reward_mean"] == pytest.approx(5 / 12)  # every answer drawn: 1+1+0+1 + 0 + 1+0+0+1 over 12
    assert m["reward_correct_mean"] == pytest.approx(5 / 12)
    assert m["reward_mean_trained"] == pytest.approx(0.5)
    assert m["generation_seconds"] == 3.0 and m["staleness_max"] == 3.0  # summed, maximum
    assert len(rollout.failure_examples) == 3


def test_stops_at_the_round_bound_and_trains_on_what_varies():
    source = ScriptedSource([make_batch([[1, 1], [0, 1]], index=i) for i in range(10)])
    rollout = DynamicSampling(source, groups=3, max_extra_rounds=1, pad_id=0).next_batch(0)
    assert source.calls == 2  # the first batch and 1 more
    assert rollout.metrics["dynamic_sampling_short"] == 1 and rollout.metrics["dynamic_sampling_groups"] == 2
    assert rollout.batch["batch_index"].tolist() == [0, 0, 1, 1]  # the varied group of each round


def test_no_varied_group_hands_on_the_first_rounds_flat_groups():
    source = ScriptedSource([make_batch([[1, 1], [0, 0]], index=i) for i in range(3)])
    rollout = DynamicSampling(source, groups=2, max_extra_rounds=2, pad_id=0).next_batch(0)
    assert source.calls == 3
    assert rollout.batch["batch_index"].tolist() == [0, 0, 0, 0]
    assert rollout.metrics["dynamic_sampling_groups"] == 0 and rollout.metrics["dynamic_sampling_short"] == 1


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


def test_combine_round_metrics_sums_maxima_and_row_weighted_means():
    m = combine_round_metrics(
        [
            ({"reward_seconds": 1.0, "staleness_max": 2.0, "staleness_mean": 1.0}, 4),
            ({"reward_seconds": 2.0, "staleness_max": 1.0, "staleness_mean": 4.0}, 2),
        ]
    )
    assert m == {"reward_seconds": 3.0, "staleness_max": 2.0, "staleness_mean": 2.0}


class FakeEnv:
    """An environment whose state is the number of resets (what StreamPosition tracks)."""

    def __init__(self):
        self.resets = 0

    def reset(self):
        self.resets += 1

    def state_dict(self):
        return {"resets": self.resets}

    def load_state_dict(self, state):
        self.resets = state["resets"]


class FakeCollector:
    """Batch ``b`` of the stream: varied groups only from batch 2 on."""

    def __init__(self):
        self.env = FakeEnv()

    def collect(self, index, version):
        from grpo_rl.rollout.collector import CollectStats

        self.env.reset()
        batch = make_batch([[1, 0], [0, 1]] if index >= 2 else [[0, 0], [0, 0]], index=index)
        del batch["batch_index"]  # the source sets it
        return batch, CollectStats()


def test_extra_rounds_consume_the_stream_in_order_and_resume_after_them():
    source = InProcessRollouts(FakeCollector())
    dynamic = DynamicSampling(source, groups=2, max_extra_rounds=4, pad_id=0)
    first = dynamic.next_batch(0)
    assert first.batch["batch_index"].tolist() == [2, 2, 2, 2] and first.metrics["sampling_rounds"] == 3
    state = dynamic.state_dict()
    assert state["next_index"] == 3 and state["resets"] == 3  # batches 0, 1 dropped, 2 trained: all consumed
    resumed = DynamicSampling(InProcessRollouts(FakeCollector()), groups=2, max_extra_rounds=4, pad_id=0)
    resumed.load_state_dict(state)
    assert resumed.next_batch(1).batch["batch_index"].tolist() == [3, 3, 3, 3]
