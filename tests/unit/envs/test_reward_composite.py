"""Tests for grpo_rl.envs.rewards.base.CompositeReward: weighting, per-component values and failure isolation."""

from __future__ import annotations

import pytest
import torch

from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent, RewardError

RESPONSES = ["42", "seven", "13", "42!"]
REFERENCES = ["42", "7", "13", "42"]


def exact(responses, references):
    return [float(r == ref) for r, ref in zip(responses, references, strict=True)]


def length(responses, references):
    return [len(r) for r in responses]  # ints are numbers too


def digits_only(responses, references):
    """Raises on any response that is not all digits, as a careless user function would."""
    return [float(int(r) > 0) for r in responses]


def test_weighted_sum_and_components():
    reward = CompositeReward([RewardComponent("exact", exact, 2.0), RewardComponent("length", length, 0.5)])
    out = reward(RESPONSES, REFERENCES)
    torch.testing.assert_close(out.components["exact"], torch.tensor([1.0, 0.0, 1.0, 0.0]))
    torch.testing.assert_close(out.components["length"], torch.tensor([2.0, 5.0, 2.0, 3.0]))
    torch.testing.assert_close(out.total, torch.tensor([2 + 1.0, 0 + 2.5, 2 + 1.0, 0 + 1.5]))
    assert out.total.dtype == torch.float32
    assert out.failures == {} and out.failure_examples == []


def test_extra_columns_reach_the_function():
    def by_keyword(responses, references, *, bonus):
        return [float(b) for b in bonus]

    out = CompositeReward([RewardComponent("bonus", by_keyword)])(["a", "b"], [None, None], bonus=[3, 4])
    torch.testing.assert_close(out.total, torch.tensor([3.0, 4.0]))


def test_component_raising_on_some_samples_gets_fallback():
    reward = CompositeReward(
        [RewardComponent("exact", exact, 1.0), RewardComponent("digits", digits_only, 1.0)], fallback=-1.0
    )
    out = reward(RESPONSES, REFERENCES)
    # "seven" and "42!" cannot be parsed: fallback -1 for them, the real value for the others
    torch.testing.assert_close(out.components["digits"], torch.tensor([1.0, -1.0, 1.0, -1.0]))
    torch.testing.assert_close(out.components["exact"], torch.tensor([1.0, 0.0, 1.0, 0.0]))
    torch.testing.assert_close(out.total, torch.tensor([2.0, -1.0, 2.0, -1.0]))
    assert out.failures == {"digits": 2}
    assert [(e["reward"], e["index"], e["response"]) for e in out.failure_examples] == [
        ("digits", 1, "seven"),
        ("digits", 3, "42!"),
    ]
    assert all("ValueError" in e["error"] for e in out.failure_examples)


def test_wrong_count_is_a_failure():
    def one_short(responses, references):
        return [1.0] * (len(responses) - 1) if len(responses) > 1 else [1.0, 1.0]

    reward = CompositeReward([RewardComponent("exact", exact), RewardComponent("short", one_short)])
    with pytest.raises(RewardError, match="short"):
        reward(RESPONSES, REFERENCES)  # batch call and every per-sample retry return the wrong count


def test_non_numbers_counted_as_failures():
    def sometimes_bad(responses, references):
        out = {"42": 1.0, "seven": "high", "13": float("nan"), "42!": None}
        return [out[r] for r in responses]

    reward = CompositeReward([RewardComponent("exact", exact), RewardComponent("bad", sometimes_bad, 3.0)])
    out = reward(RESPONSES, REFERENCES)
    torch.testing.assert_close(out.components["bad"], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(out.total, torch.tensor([1.0 + 3.0, 0.0, 1.0, 0.0]))
    assert out.failures == {"bad": 3}
    assert sorted(e["index"] for e in out.failure_examples) == [1, 2, 3]
    assert "finite numbers" in out.failure_examples[0]["error"]


def test_tensor_output_is_accepted():
    out = CompositeReward([RewardComponent("t", lambda r, ref: torch.tensor([0.5, 1.5]))])(["a", "b"], [None, None])
    torch.testing.assert_close(out.total, torch.tensor([0.5, 1.5]))


def test_every_sample_failing_raises():
    def broken(responses, references):
        raise KeyError("ground_truth")

    reward = CompositeReward([RewardComponent("exact", exact), RewardComponent("broken", broken)])
    with pytest.raises(RewardError, match="broken.*every sample"):
        reward(RESPONSES, REFERENCES)
    with pytest.raises(RewardError):
        reward(["x"], ["y"])  # a single-sample step takes the no-retry path


def test_no_components_raises():
    with pytest.raises(ValueError, match="at least one"):
        CompositeReward([])
