"""Tests for the IcePop band modes of the engine correction (token_band_mask, sequence_band_mask), against values
computed by hand from grpo_rl/algo/engine_correction.py's docstring."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_rl.algo.engine_correction import engine_weights
from grpo_rl.algo.loss import LossSettings, grpo_loss

# One answer of three tokens with engine weights pi_old / mu = [3, 1.5, 0.25]; ratio 1, A = +1, so the token
# loss is -w and the token mean -sum(w) / 3.
E_OLD = torch.full((1, 3), -1.0)
E_BEHAVIOR = E_OLD - torch.tensor([[math.log(3.0), math.log(1.5), math.log(0.25)]])
E_MASK = torch.ones(1, 3)

# Two answers: row 0's token weights [2, 0.75] (product 1.5, geometric mean sqrt(1.5)), row 1's single weight 0.25;
# the padding's log-weight (ln 100) must not count.
S_OLD = torch.full((2, 2), -1.0)
S_BEHAVIOR = S_OLD - torch.tensor([[math.log(2.0), math.log(0.75)], [math.log(0.25), math.log(100.0)]])
S_MASK = torch.tensor([[1, 1], [1, 0]])


def _band(mode: str, low: float, high: float, tis_cap: float = 2.0) -> LossSettings:
    return LossSettings(tis_cap=tis_cap, engine_correction=mode, engine_correction_min=low, engine_correction_max=high)


@pytest.mark.parametrize(
    ("low", "high", "weights", "masked"),
    [
        (0.5, 5.0, [3.0, 1.5, 0.0], 1 / 3),  # IcePop's band: the 3 passes with its ratio kept, M(k) = k
        (0.2, 5.0, [3.0, 1.5, 0.25], 0.0),
        (0.5, 2.0, [0.0, 1.5, 0.0], 2 / 3),
    ],
)
def test_token_band_mask_keeps_the_ratio_inside_and_zeroes_outside(low, high, weights, masked):
    # tis_cap (1.2 here) is not the band's upper bound: engine_correction_max is.
    out = grpo_loss(
        E_OLD.clone(),
        E_OLD,
        torch.ones(1),
        E_MASK,
        behavior_logprobs=E_BEHAVIOR,
        settings=_band("token_band_mask", low, high, tis_cap=1.2),
    )
    assert float(out.loss.detach()) == pytest.approx(-sum(weights) / 3, abs=1e-6)
    assert float(out.engine_masked_fraction) == pytest.approx(masked)
    assert float(out.tis_fraction) == pytest.approx(masked)  # every weight outside the band is masked


def test_token_band_mask_equals_token_mask_with_the_same_two_bounds():
    band = grpo_loss(
        E_OLD.clone(),
        E_OLD,
        torch.ones(1),
        E_MASK,
        behavior_logprobs=E_BEHAVIOR,
        settings=_band("token_band_mask", 0.5, 2.0),
    )
    mask = grpo_loss(
        E_OLD.clone(),
        E_OLD,
        torch.ones(1),
        E_MASK,
        behavior_logprobs=E_BEHAVIOR,
        settings=LossSettings(tis_cap=2.0, engine_correction="token_mask", engine_correction_min=0.5),
    )
    assert float(band.loss) == float(mask.loss)
    # token_mask without a lower bound keeps the 0.25 token; the band always has one
    no_low = grpo_loss(
        E_OLD.clone(),
        E_OLD,
        torch.ones(1),
        E_MASK,
        behavior_logprobs=E_BEHAVIOR,
        settings=LossSettings(tis_cap=2.0, engine_correction="token_mask"),
    )
    assert float(no_low.loss) == pytest.approx(-(1.5 + 0.25) / 3)


@pytest.mark.parametrize(
    ("low", "high", "row_weights", "masked"),
    [
        (0.5, 5.0, [math.sqrt(1.5), 0.0], 1 / 3),  # row 1 (0.25) masked; row 0 gets its geometric mean
        (0.2, 1.2, [0.0, 0.25], 2 / 3),  # sqrt(1.5) = 1.22 > 1.2: row 0 masked
        (0.2, 5.0, [math.sqrt(1.5), 0.25], 0.0),
    ],
)
def test_sequence_band_mask_uses_the_geometric_mean_of_the_answer(low, high, row_weights, masked):
    out = grpo_loss(
        S_OLD.clone(),
        S_OLD,
        torch.ones(2),
        S_MASK,
        behavior_logprobs=S_BEHAVIOR,
        settings=_band("sequence_band_mask", low, high),
    )
    # token mean of -w over the 3 answer tokens, row 0's weight on both of its tokens
    assert float(out.loss.detach()) == pytest.approx(-(2 * row_weights[0] + row_weights[1]) / 3, abs=1e-6)
    assert float(out.engine_masked_fraction) == pytest.approx(masked)
    # the quantiles are over the answers' geometric means [0.25, sqrt(1.5)]
    assert float(out.engine_weight_p50) == pytest.approx((0.25 + math.sqrt(1.5)) / 2, abs=1e-6)


def test_sequence_band_mask_keeps_a_long_answer_that_sequence_mask_drops():
    # 100 tokens of weight e^0.05: product e^5 = 148 leaves [0.5, 5]; the geometric mean e^0.05 stays inside.
    old = torch.zeros(1, 100)
    behavior = old - 0.05
    mask = torch.ones(1, 100)
    band = engine_weights(old, behavior, mask, mode="sequence_band_mask", min_weight=0.5, max_weight=5.0)
    torch.testing.assert_close(band.raw, torch.tensor([[math.exp(0.05)]]))
    torch.testing.assert_close(band.weight_BT, torch.full((1, 100), math.exp(0.05)))
    assert not band.masked_BT.any()
    product = engine_weights(old, behavior, mask, mode="sequence_mask", cap=5.0, min_weight=0.5)
    assert product.masked_BT.all() and float(product.weight_BT.abs().sum()) == 0.0


@pytest.mark.parametrize("mode", ["token_band_mask", "sequence_band_mask"])
def test_band_modes_need_both_bounds(mode):
    with pytest.raises(ValueError, match="min_weight and max_weight"):
        engine_weights(S_OLD, S_BEHAVIOR, S_MASK, mode=mode, min_weight=0.5)
    with pytest.raises(ValueError, match="min_weight and max_weight"):
        engine_weights(S_OLD, S_BEHAVIOR, S_MASK, mode=mode, max_weight=5.0)
