"""Tests for grpo_rl.algo.advantages.group_advantages (and the advantage stage) with hand-computed groups."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from grpo_rl.algo.advantages import assign_advantages, group_advantages


def consecutive(num_groups: int, group_size: int) -> torch.Tensor:
    """``group_id`` of ``num_groups`` full groups in engine order: ``[0]*G + [1]*G + ...``."""
    return torch.arange(num_groups * group_size) // group_size


def test_mean_centred_and_std_normalised_with_unbiased_std():
    # Group [0, 1, 2]: mean 1, unbiased std sqrt((1 + 0 + 1) / 2) = 1 (the biased std would be 0.816).
    out = group_advantages(torch.tensor([0.0, 1.0, 2.0, 5.0, 5.0, 8.0]), consecutive(2, 3))
    # Group [5, 5, 8]: mean 6, unbiased std sqrt((1 + 1 + 4) / 2) = sqrt(3).
    s3 = math.sqrt(3.0)
    expected = torch.tensor([-1.0, 0.0, 1.0, -1 / s3, -1 / s3, 2 / s3])
    torch.testing.assert_close(out.advantage, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.group_mean, torch.tensor([1.0, 1.0, 1.0, 6.0, 6.0, 6.0]))
    torch.testing.assert_close(out.group_std, torch.tensor([1.0, 1.0, 1.0, s3, s3, s3]))
    assert out.num_zero_variance_groups == 0 and out.num_groups == 2
    assert not out.zero_variance.any()


def test_zero_variance_groups_counted_and_marked():
    # Group 0: [1, 0, 0, 1], mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 1/sqrt(3) -> +-0.5 * sqrt(3).
    # Group 1: all 2 -> zero advantage, marked. Group 2: all 0 -> marked.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0])
    out = group_advantages(rewards, consecutive(3, 4))
    a = 0.5 * math.sqrt(3.0)
    torch.testing.assert_close(out.advantage, torch.tensor([a, -a, -a, a] + [0.0] * 8), atol=1e-5, rtol=0)
    assert out.num_zero_variance_groups == 2
    assert out.zero_variance.tolist() == [False] * 4 + [True] * 8
    assert torch.isfinite(out.advantage).all()


def test_dr_grpo_does_not_scale_by_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 2.0])
    out = group_advantages(rewards, consecutive(2, 4), scale_by_std=False)
    torch.testing.assert_close(out.advantage, torch.tensor([0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0, 0.0]))


def test_output_shapes_and_integer_rewards():
    out = group_advantages(torch.tensor([0, 1, 1, 1]), consecutive(2, 2))  # int rewards are accepted
    assert out.advantage.dtype == torch.float32
    for t in (out.advantage, out.group_mean, out.group_std, out.zero_variance):
        assert t.shape == (4,)
    assert out.zero_variance.tolist() == [False, False, True, True]


# Interleaved, unevenly sized groups with arbitrary ids: 7 -> rows 0, 3, 5; 2 -> rows 1, 4; 40 -> row 2 alone;
# 5 -> rows 6, 7, 8, 9.
SCATTERED_IDS = torch.tensor([7, 2, 40, 7, 2, 7, 5, 5, 5, 5])
SCATTERED_REWARDS = torch.tensor([0.0, 1.0, 9.0, 3.0, 4.0, 6.0, 1.0, 1.0, 1.0, 1.0])


def test_scattered_uneven_groups_by_hand():
    out = group_advantages(SCATTERED_REWARDS, SCATTERED_IDS)
    # 7: [0, 3, 6], mean 3, unbiased std sqrt((9 + 0 + 9) / 2) = 3 -> -1, 0, 1.
    # 2: [1, 4], mean 2.5, unbiased std sqrt(2 * 1.5^2) = 1.5 * sqrt(2) -> -+1/sqrt(2).
    # 40: [9] alone: mean 9, std 0, advantage 0, zero variance. 5: [1, 1, 1, 1]: zero variance.
    r2 = 1 / math.sqrt(2.0)
    want = torch.tensor([-1.0, -r2, 0.0, 0.0, r2, 1.0, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(out.advantage, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.group_mean, torch.tensor([3.0, 2.5, 9.0, 3.0, 2.5, 3.0, 1.0, 1.0, 1.0, 1.0]))
    s2 = 1.5 * math.sqrt(2.0)
    torch.testing.assert_close(out.group_std, torch.tensor([3.0, s2, 0.0, 3.0, s2, 3.0, 0.0, 0.0, 0.0, 0.0]))
    assert out.zero_variance.tolist() == [False, False, True, False, False, False, True, True, True, True]
    assert out.num_groups == 4 and out.num_zero_variance_groups == 2


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_scattered_groups_equal_a_loop_over_groups(scale_by_std):
    g = torch.Generator().manual_seed(0)
    group_id = torch.randint(0, 9, (40,), generator=g) * 3 + 100  # uneven, interleaved, non-contiguous ids
    rewards = torch.randn(40, generator=g)
    out = group_advantages(rewards, group_id, scale_by_std=scale_by_std)
    want = torch.empty(40)
    for gid in group_id.unique():
        rows = group_id == gid
        r = rewards[rows]
        std = r.std() if r.numel() > 1 else torch.tensor(0.0)
        want[rows] = (r - r.mean()) / (std + 1e-6) if scale_by_std else r - r.mean()
    torch.testing.assert_close(out.advantage, want, atol=1e-5, rtol=1e-5)
    assert out.num_groups == len(group_id.unique())


def test_group_of_one_has_zero_advantage():
    out = group_advantages(torch.tensor([5.0, 1.0, 3.0]), torch.tensor([0, 1, 1]))
    # [5] alone: 0 (not NaN, not 5 / eps); [1, 3]: mean 2, std sqrt(2) -> -+1/sqrt(2).
    torch.testing.assert_close(
        out.advantage, torch.tensor([0.0, -1 / math.sqrt(2.0), 1 / math.sqrt(2.0)]), atol=1e-5, rtol=0
    )
    assert out.zero_variance.tolist() == [True, False, False]


def test_row_order_does_not_matter():
    perm = torch.tensor([9, 0, 4, 2, 7, 1, 8, 3, 6, 5])
    out = group_advantages(SCATTERED_REWARDS, SCATTERED_IDS)
    shuffled = group_advantages(SCATTERED_REWARDS[perm], SCATTERED_IDS[perm])
    torch.testing.assert_close(shuffled.advantage, out.advantage[perm])
    assert torch.equal(shuffled.zero_variance, out.zero_variance[perm])


def test_group_id_must_match_rewards():
    with pytest.raises(ValueError, match="group_id"):
        group_advantages(torch.zeros(8), torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match="group_id"):
        group_advantages(torch.zeros(4), torch.zeros(4))  # float ids


def test_rewards_must_be_one_dimensional():
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.long))


# --------------------------------------------------------------------------- assign_advantages


def _scored(rewards: list[float], group_id: list[int]) -> TensorDict:
    n = len(rewards)
    return TensorDict(
        {"reward": torch.tensor(rewards), "group_id": torch.tensor(group_id), "row": torch.arange(n)}, batch_size=[n]
    )


def test_assign_advantages_uses_group_id_and_filters_whole_groups():
    # Groups 3: [1, 0] (signal), 8: [1, 1, 1] (none), 4: [2, 0, 1] (signal) - of different sizes, as after a
    # whole-group filter upstream.
    batch = _scored([1.0, 0.0, 1.0, 1.0, 1.0, 2.0, 0.0, 1.0], [3, 3, 8, 8, 8, 4, 4, 4])
    out, stats = assign_advantages(batch, scale_by_std=False, filter_zero_variance=True)
    assert out["row"].tolist() == [0, 1, 5, 6, 7]  # group 8 dropped as a whole, the others kept whole
    torch.testing.assert_close(out["advantage"], torch.tensor([0.5, -0.5, 1.0, -1.0, 0.0]))
    assert stats["zero_variance_groups"] == 1.0
    assert stats["zero_variance_fraction"] == pytest.approx(1 / 3)  # per group, not rows / group_size


def test_assign_advantages_keeps_everything_without_the_filter():
    out, stats = assign_advantages(_scored([1.0, 1.0, 0.0, 2.0], [0, 0, 1, 1]))
    assert out.batch_size[0] == 4
    assert out["zero_variance"].tolist() == [True, True, False, False]
    assert stats["zero_variance_fraction"] == pytest.approx(0.5)


def test_assign_advantages_passes_advantage_eps():
    # Rewards [0, 1e-4]: centred +-5e-5, std 1e-4 / sqrt(2); the eps decides how far that is scaled up.
    std = 1e-4 / 2**0.5
    for eps in (1e-6, 1e-4):
        out, _ = assign_advantages(_scored([0.0, 1e-4], [0, 0]), advantage_eps=eps)
        expected = 5e-5 / (std + eps)
        torch.testing.assert_close(out["advantage"], torch.tensor([-expected, expected]), rtol=1e-3, atol=0.0)
