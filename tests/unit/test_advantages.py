"""Tests for grpo_rl.advantages.group_advantages with hand-computed groups."""
from __future__ import annotations

import math

import pytest
import torch

from grpo_rl.advantages import group_advantages


def test_mean_centred_and_std_normalised_with_unbiased_std():
    # Group [0, 1, 2]: mean 1, unbiased std sqrt((1 + 0 + 1) / 2) = 1 (the biased std would be 0.816).
    out = group_advantages(torch.tensor([0.0, 1.0, 2.0, 5.0, 5.0, 8.0]), 3)
    # Group [5, 5, 8]: mean 6, unbiased std sqrt((1 + 1 + 4) / 2) = sqrt(3).
    s3 = math.sqrt(3.0)
    expected = torch.tensor([-1.0, 0.0, 1.0, -1 / s3, -1 / s3, 2 / s3])
    torch.testing.assert_close(out.advantage, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.group_mean, torch.tensor([1.0, 1.0, 1.0, 6.0, 6.0, 6.0]))
    torch.testing.assert_close(out.group_std, torch.tensor([1.0, 1.0, 1.0, s3, s3, s3]))
    assert out.num_zero_variance_groups == 0
    assert not out.zero_variance.any()


def test_zero_variance_groups_counted_and_marked():
    # Group 0: [1, 0, 0, 1], mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 1/sqrt(3) -> +-0.5 * sqrt(3).
    # Group 1: all 2 -> zero advantage, marked. Group 2: all 0 -> marked.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0])
    out = group_advantages(rewards, 4)
    a = 0.5 * math.sqrt(3.0)
    torch.testing.assert_close(out.advantage, torch.tensor([a, -a, -a, a] + [0.0] * 8), atol=1e-5, rtol=0)
    assert out.num_zero_variance_groups == 2
    assert out.zero_variance.tolist() == [False] * 4 + [True] * 8
    assert torch.isfinite(out.advantage).all()


def test_dr_grpo_does_not_scale_by_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 2.0])
    out = group_advantages(rewards, 4, scale_by_std=False)
    torch.testing.assert_close(out.advantage, torch.tensor([0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0, 0.0]))


def test_output_shapes_and_integer_rewards():
    out = group_advantages(torch.tensor([0, 1, 1, 1]), 2)  # int rewards are accepted
    assert out.advantage.dtype == torch.float32
    for t in (out.advantage, out.group_mean, out.group_std, out.zero_variance):
        assert t.shape == (4,)
    assert out.zero_variance.tolist() == [False, False, True, True]


@pytest.mark.parametrize("group_size", [0, 3, 5])
def test_group_size_must_divide_rewards(group_size):
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(8), group_size)


def test_rewards_must_be_one_dimensional():
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 4), 4)
