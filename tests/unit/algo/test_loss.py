"""Tests for grpo_rl.algo.loss against values computed by hand from the formulas in its docstrings."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_rl.algo.advantages import kl_penalised_rewards
from grpo_rl.algo.loss import LossSettings, aggregate, grpo_loss, kl_estimate

# A 2 x 3 case with a ragged mask: row 0 has 2 response tokens, row 1 has 1.
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def _zeros(shape=(2, 3)) -> torch.Tensor:
    return torch.zeros(shape)


@pytest.mark.parametrize(
    ("mode", "max_tokens", "expected"),
    [
        ("token_mean", None, (1 + 2 + 4) / 3),  # all unmasked tokens weigh the same
        ("seq_mean_token_mean", None, ((1 + 2) / 2 + 4 / 1) / 2),  # each row's mean, then the mean of rows
        ("seq_mean_token_sum_norm", 3, ((1 + 2) / 3 + 4 / 3) / 2),  # row sums over a constant, then mean
        ("seq_mean_token_sum_norm", 4, ((1 + 2) / 4 + 4 / 4) / 2),
    ],
)
def test_aggregate_hand_computed(mode, max_tokens, expected):
    assert float(aggregate(VALUES, MASK, mode, max_tokens)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mode", "max_tokens", "expected"),
    [
        ("token_mean", None, (1 + 2 + 4) / 3),
        ("seq_mean_token_mean", None, 2.75),
        ("seq_mean_token_sum_norm", 3, 7 / 6),
    ],
)
def test_policy_loss_aggregations_at_ratio_one(mode, max_tokens, expected):
    # At ratio 1 (old == new) the per-token policy loss is -advantage, so per-token advantages equal to
    # VALUES give minus the aggregation of VALUES; the masked 3, 5, 6 must not count.
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]])
    out = grpo_loss(
        logprobs, logprobs.clone(), VALUES, MASK, settings=LossSettings(aggregation=mode, max_tokens=max_tokens)
    )
    assert float(out.loss_policy) == pytest.approx(-expected)
    assert float(out.loss) == pytest.approx(-expected)
    assert float(out.loss_kl) == 0.0
    assert float(out.clip_fraction) == 0.0
    assert float(out.ratio_mean) == pytest.approx(1.0)


def test_unknown_aggregation_and_missing_max_tokens_raise():
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(VALUES, MASK, "sum", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(VALUES, MASK, "seq_mean_token_sum_norm", None)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same"):
        grpo_loss(_zeros(), _zeros((2, 2)), torch.ones(2), MASK)


# (ratio, advantage, expected per-token loss, clipped?) with eps_low=0.2, eps_high=0.28.
CLIP_CASES = [
    (1.5, +1.0, -1.28, True),  # above 1 + eps_high with A > 0: clipped to 1.28
    (1.25, +1.0, -1.25, False),  # above 1 + eps_low but below 1 + eps_high: the high epsilon is separate
    (1.5, -1.0, 1.5, False),  # above the range with A < 0: the unclipped term is larger, kept
    (0.5, -1.0, 0.8, True),  # below 1 - eps_low with A < 0: clipped to 0.8
    (0.78, -1.0, 0.8, True),
    (0.5, +1.0, -0.5, False),  # below the range with A > 0: kept
    (0.9, +1.0, -0.9, False),  # inside the range
]


@pytest.mark.parametrize(("ratio", "adv", "expected", "clipped"), CLIP_CASES)
def test_clipping_low_and_high_separately(ratio, adv, expected, clipped):
    old = torch.tensor([[-1.0]])
    logprobs = (old + math.log(ratio)).requires_grad_(True)
    out = grpo_loss(
        logprobs,
        old,
        torch.tensor([adv]),
        torch.ones(1, 1),
        settings=LossSettings(clip_eps_low=0.2, clip_eps_high=0.28),
    )
    assert float(out.loss.detach()) == pytest.approx(expected, abs=1e-6)
    assert float(out.clip_fraction) == (1.0 if clipped else 0.0)
    out.loss.backward()
    # A clipped token carries no gradient; an unclipped one has d(-A r)/d log pi = -A r.
    expected_grad = 0.0 if clipped else -adv * ratio
    assert float(logprobs.grad) == pytest.approx(expected_grad, abs=1e-6)


def test_clip_fraction_counts_only_unmasked_tokens():
    # Per-token ratios and advantages taken from CLIP_CASES; clipped pattern [[T, F, F], [T, F, T]].
    ratio = torch.tensor([[1.5, 1.5, 1.25], [0.5, 0.5, 0.78]])
    adv = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0]])
    old = torch.full((2, 3), -2.0)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the clipped [1, 2] token is padding
    out = grpo_loss(old + ratio.log(), old, adv, mask, settings=LossSettings(clip_eps_low=0.2, clip_eps_high=0.28))
    assert float(out.clip_fraction) == pytest.approx(2 / 5)
    assert float(out.loss) == pytest.approx((-1.28 + 1.5 - 1.25 + 0.8 - 0.5) / 5, abs=1e-6)
    assert float(out.ratio_mean) == pytest.approx((1.5 + 1.5 + 1.25 + 0.5 + 0.5) / 5, abs=1e-6)


def test_kl_approx_diagnostic():
    # k3 of KL(old || new) at ratio r is (r - 1) - log r.
    old = torch.tensor([[-1.0, -1.0]])
    logprobs = old + torch.tensor([[math.log(1.5), math.log(0.5)]])
    out = grpo_loss(logprobs, old, torch.ones(1), torch.ones(1, 2))
    expected = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert float(out.kl_approx) == pytest.approx(expected, abs=1e-6)


# log r = logprobs - ref = [0.5, -1.0]
KL_LOGPROBS = torch.tensor([[-1.0, -2.0]])
KL_REF = torch.tensor([[-1.5, -1.0]])
KL_EXPECTED = {
    "k1": [0.5, -1.0],
    "k2": [0.5 * 0.25, 0.5 * 1.0],
    "k3": [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0],
}


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_hand_computed(estimator):
    got = kl_estimate(KL_LOGPROBS, KL_REF, estimator)
    torch.testing.assert_close(got, torch.tensor([KL_EXPECTED[estimator]]))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_term_in_loss(estimator):
    out = grpo_loss(
        KL_LOGPROBS,
        KL_LOGPROBS.clone(),
        torch.zeros(1),
        torch.ones(1, 2),
        ref_logprobs=KL_REF,
        settings=LossSettings(kl_coef=0.1, kl_estimator=estimator),
    )
    mean_kl = sum(KL_EXPECTED[estimator]) / 2
    assert float(out.loss_kl) == pytest.approx(0.1 * mean_kl, abs=1e-6)
    assert float(out.kl_ref) == pytest.approx(mean_kl, abs=1e-6)
    assert float(out.loss_policy) == 0.0  # zero advantage
    assert float(out.loss) == pytest.approx(0.1 * mean_kl, abs=1e-6)


def test_kl_term_uses_the_same_aggregation_as_the_policy_term():
    logprobs = torch.tensor([[-1.0, -2.0, -1.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, -9.0], [-3.0, -9.0, -9.0]])  # k1: [[0.5, -1.0, pad], [2.0, pad, pad]]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = grpo_loss(
        logprobs,
        logprobs.clone(),
        torch.zeros(2),
        mask,
        ref_logprobs=ref,
        settings=LossSettings(kl_coef=1.0, kl_estimator="k1", aggregation="seq_mean_token_mean"),
    )
    assert float(out.loss_kl) == pytest.approx(((0.5 - 1.0) / 2 + 2.0) / 2)
    # the diagnostic is a plain per-token mean
    assert float(out.kl_ref) == pytest.approx((0.5 - 1.0 + 2.0) / 3)


def test_kl_coef_without_ref_logprobs_raises():
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(_zeros(), _zeros(), torch.ones(2), MASK, settings=LossSettings(kl_coef=0.1))


def test_kl_zero_coef_still_reports_kl_to_reference():
    out = grpo_loss(
        KL_LOGPROBS,
        KL_LOGPROBS.clone(),
        torch.zeros(1),
        torch.ones(1, 2),
        ref_logprobs=KL_REF,
        settings=LossSettings(kl_coef=0.0, kl_estimator="k1"),
    )
    assert float(out.loss_kl) == 0.0
    assert float(out.kl_ref) == pytest.approx(-0.25)


def test_truncated_importance_weight_capped():
    # old - behavior = log 3 and log 1.5: weights 3 (capped at 2) and 1.5.
    old = torch.tensor([[-1.0, -1.0]])
    behavior = old - torch.tensor([[math.log(3.0), math.log(1.5)]])
    kwargs = dict(behavior_logprobs=behavior)
    capped = grpo_loss(old.clone(), old, torch.ones(1), torch.ones(1, 2), settings=LossSettings(tis_cap=2.0), **kwargs)
    assert float(capped.loss) == pytest.approx(-(2.0 + 1.5) / 2, abs=1e-6)
    assert float(capped.tis_fraction) == pytest.approx(0.5)
    # ESS of the weights [2, 1.5] over 2 tokens: (3.5^2 / (4 + 2.25)) / 2
    assert float(capped.ess) == pytest.approx(12.25 / 6.25 / 2, abs=1e-6)

    uncapped = grpo_loss(
        old.clone(), old, torch.ones(1), torch.ones(1, 2), settings=LossSettings(tis_cap=10.0), **kwargs
    )
    assert float(uncapped.loss) == pytest.approx(-(3.0 + 1.5) / 2, abs=1e-6)
    assert float(uncapped.tis_fraction) == 0.0

    disabled = grpo_loss(
        old.clone(), old, torch.ones(1), torch.ones(1, 2), settings=LossSettings(tis_cap=None), **kwargs
    )
    assert float(disabled.loss) == pytest.approx(-1.0)
    assert float(disabled.ess) == pytest.approx(1.0)


def test_gradient_single_update_token_mean():
    # epochs == 1: old = logprobs.detach(), so d loss / d logprobs = -A * mask / n_tokens.
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]], requires_grad=True)
    adv = torch.tensor([1.0, -2.0])
    out = grpo_loss(logprobs, logprobs.detach(), adv, MASK, settings=LossSettings(tis_cap=None))
    out.loss.backward()
    expected = torch.tensor([[-1 / 3, -1 / 3, 0.0], [2 / 3, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected)


def test_scale_multiplies_loss_terms_not_diagnostics():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]])
    ref = logprobs - 0.3
    old = logprobs + 0.1
    kwargs = dict(ref_logprobs=ref, settings=LossSettings(kl_coef=0.2, aggregation="seq_mean_token_mean"))
    full = grpo_loss(logprobs, old, torch.tensor([1.0, -0.5]), MASK, **kwargs)
    quarter = grpo_loss(logprobs, old, torch.tensor([1.0, -0.5]), MASK, scale=0.25, **kwargs)
    assert float(full.loss_kl) != 0.0 and float(full.loss_policy) != 0.0
    assert float(quarter.loss) == pytest.approx(0.25 * float(full.loss))
    assert float(quarter.loss_policy) == pytest.approx(0.25 * float(full.loss_policy))
    assert float(quarter.loss_kl) == pytest.approx(0.25 * float(full.loss_kl))
    assert float(quarter.kl_ref) == pytest.approx(float(full.kl_ref))
    assert float(quarter.kl_approx) == pytest.approx(float(full.kl_approx))


def test_entropy_diagnostic_and_diagnostics_dict():
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    out = grpo_loss(_zeros(), _zeros(), torch.ones(2), MASK, entropy=entropy)
    assert float(out.entropy) == pytest.approx((1 + 2 + 3) / 3)
    diag = out.diagnostics()
    assert diag["entropy"] == pytest.approx(2.0)
    assert {"loss", "loss_policy", "loss_kl", "clip_fraction", "kl_approx", "ess"} <= diag.keys()
    assert all(isinstance(v, float) for v in diag.values())


def test_kl_penalised_rewards():
    rewards = torch.tensor([1.0, 0.0])
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    ref = torch.tensor([[-1.5, -1.0], [-2.5, -1.0]])  # k1 = [[0.5, -1.0], [2.0, -2.0 (masked)]]
    mask = torch.tensor([[1, 1], [1, 0]])
    got = kl_penalised_rewards(rewards, logprobs, ref, mask, kl_coef=0.5, estimator="k1")
    torch.testing.assert_close(got, torch.tensor([1.0 - 0.5 * (-0.5), 0.0 - 0.5 * 2.0]))
    got_k2 = kl_penalised_rewards(rewards, logprobs, ref, mask, kl_coef=0.5, estimator="k2")
    torch.testing.assert_close(got_k2, torch.tensor([1.0 - 0.5 * (0.125 + 0.5), 0.0 - 0.5 * 2.0]))
