"""Tests for the SAPO and GMPO policy terms against values computed by hand from the formulas in
grpo_rl/algo/objectives.py's docstring."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_rl.algo.loss import LossSettings, grpo_loss
from grpo_rl.algo.objectives import policy_term

LN2 = math.log(2.0)
# Row 0 has 2 answer tokens with log-ratios [ln 2, 0] (ratios [2, 1]), row 1 one token with log-ratio -ln 2
# (ratio 0.5); the padding's log-ratio (5.0) must not count.
OLD = torch.full((2, 3), -2.0)
LOGPROBS = OLD + torch.tensor([[LN2, 0.0, 5.0], [-LN2, 5.0, 5.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])
ADV = torch.tensor([1.0, -1.0])


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.clone().requires_grad_(True)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _sapo_gate(r: float, tau: float) -> float:
    """f(r) = sigmoid(tau (r - 1)) * 4 / tau."""
    return _sigmoid(tau * (r - 1.0)) * 4.0 / tau


def _sapo_weight(r: float, tau: float) -> float:
    """d f(r) / d log r = 4 p (1 - p) r, p = sigmoid(tau (r - 1))."""
    p = _sigmoid(tau * (r - 1.0))
    return 4.0 * p * (1.0 - p) * r


# --------------------------------------------------------------------------- SAPO


def test_sapo_value_and_gate_gradient_by_hand():
    # Row 0 (A = +1, tau_pos = 1): ratios [2, 1]; row 1 (A = -1, tau_neg = 1.05): ratio 0.5. Per answer token mean,
    # then mean over the 2 answers, so d loss / d logp_t = -A * 4 p (1 - p) r / |y_i| / 2.
    lp = _leaf(LOGPROBS)
    out = grpo_loss(
        lp, OLD, ADV, MASK, settings=LossSettings(loss_type="sapo", aggregation="seq_mean_token_mean", tis_cap=None)
    )
    row0 = -(_sapo_gate(2.0, 1.0) + _sapo_gate(1.0, 1.0)) / 2  # -(4 sigmoid(1) + 2) / 2
    row1 = _sapo_gate(0.5, 1.05)
    assert float(out.loss_policy.detach()) == pytest.approx((row0 + row1) / 2, abs=1e-6)
    assert float(out.clip_fraction) == 0.0  # a soft gate: nothing is clipped
    out.loss.backward()
    expected = torch.tensor(
        [[-_sapo_weight(2.0, 1.0) / 4, -_sapo_weight(1.0, 1.0) / 4, 0.0], [_sapo_weight(0.5, 1.05) / 2, 0.0, 0.0]]
    )
    torch.testing.assert_close(lp.grad, expected)
    assert _sapo_weight(1.0, 1.0) == 1.0  # at ratio 1 the gate passes GRPO's gradient whole
    assert _sapo_weight(2.0, 1.0) == pytest.approx(2 * 4 * math.e / (1 + math.e) ** 2)  # 1.573 instead of 2


def test_sapo_picks_the_temperature_by_the_advantage_sign():
    # One token at ratio 2, A = +1 then A = -1: the gate uses tau_pos, then tau_neg.
    old = torch.full((1, 1), -1.0)
    for adv, tau in ((1.0, 3.0), (-1.0, 0.5)):
        lp = _leaf(old + LN2)
        out = grpo_loss(
            lp,
            old,
            torch.tensor([adv]),
            torch.ones(1, 1),
            settings=LossSettings(
                loss_type="sapo",
                sapo_temperature_pos=3.0,
                sapo_temperature_neg=0.5,
                aggregation="seq_mean_token_mean",
                tis_cap=None,
            ),
        )
        assert float(out.loss.detach()) == pytest.approx(-adv * _sapo_gate(2.0, tau), abs=1e-6)
        out.loss.backward()
        assert float(lp.grad) == pytest.approx(-adv * _sapo_weight(2.0, tau), abs=1e-6)


def test_sapo_on_policy_gradient_equals_grpos():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]])
    grads = []
    for loss_type in ("grpo", "sapo"):
        lp = _leaf(logprobs)
        grpo_loss(
            lp,
            lp.detach(),
            ADV,
            MASK,
            settings=LossSettings(loss_type=loss_type, aggregation="seq_mean_token_mean", tis_cap=None),
        ).loss.backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[1], grads[0])
    torch.testing.assert_close(grads[0], torch.tensor([[-1 / 4, -1 / 4, 0.0], [1 / 2, 0.0, 0.0]]))


def test_sapo_gate_shrinks_the_gradient_where_the_clip_cuts_it():
    # A = +1, ratio e (far past 1 + eps): GRPO's clipped token has no gradient; SAPO's keeps the unclipped
    # surrogate's -r A times the gate's 4 p (1 - p) = 0.52, p = sigmoid(e - 1).
    old = torch.full((1, 1), -1.0)
    grads = {}
    for objective in ("grpo", "sapo"):
        lp = _leaf(old + 1.0)
        policy_term(lp, old, torch.ones(1, 1), torch.ones(1, 1), objective=objective).loss_BT.sum().backward()
        grads[objective] = float(lp.grad)
    assert grads["grpo"] == 0.0
    assert grads["sapo"] == pytest.approx(-_sapo_weight(math.e, 1.0), abs=1e-6)
    p = _sigmoid(math.e - 1.0)
    assert grads["sapo"] / -math.e == pytest.approx(4 * p * (1 - p), abs=1e-6)
    assert 0.5 < grads["sapo"] / -math.e < 0.55


# --------------------------------------------------------------------------- GMPO


def test_gmpo_clips_tokens_in_log_space_then_takes_the_geometric_mean():
    # eps 0.4. Row 0, A = +1, log-ratios [ln 2, 0]: min(ln 2, 0.4) = 0.4 (clipped), 0 -> s_0 = e^0.2.
    # Row 1, A = -1, log-ratio -ln 2: max(-ln 2, -0.4) = -0.4 (clipped) -> s_1 = e^-0.4.
    # Loss mean_i(-A_i s_i); only row 0's unclipped token has a gradient: -A s_0 / |y_0| / 2.
    lp = _leaf(LOGPROBS)
    out = grpo_loss(
        lp, OLD, ADV, MASK, settings=LossSettings(loss_type="gmpo", aggregation="seq_mean_token_mean", tis_cap=None)
    )
    assert float(out.loss_policy.detach()) == pytest.approx((-math.exp(0.2) + math.exp(-0.4)) / 2, abs=1e-6)
    assert float(out.clip_fraction) == pytest.approx(2 / 3)  # the ln 2 and -ln 2 tokens
    # the reported ratio is the unclipped geometric mean, GSPO's s_i: [sqrt 2, sqrt 2] and [0.5]
    assert float(out.ratio_mean) == pytest.approx((2 * math.sqrt(2.0) + 0.5) / 3, abs=1e-6)
    out.loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -math.exp(0.2) / 4, 0.0], [0.0, 0.0, 0.0]]))


def test_gmpo_clip_is_one_sided_as_ppos():
    # A = +1 and a falling ratio (log-ratios [-ln 2, 0]): no clip, s = 2^-1/2, each token's gradient -s / 2.
    old = torch.full((1, 2), -1.0)
    lp = _leaf(old + torch.tensor([[-LN2, 0.0]]))
    out = grpo_loss(
        lp,
        old,
        torch.ones(1),
        torch.ones(1, 2),
        settings=LossSettings(loss_type="gmpo", aggregation="seq_mean_token_mean", tis_cap=None),
    )
    s = 2**-0.5
    assert float(out.loss.detach()) == pytest.approx(-s, abs=1e-6)
    assert float(out.clip_fraction) == 0.0
    out.loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-s / 2, -s / 2]]))
    # a wider range lets row 0's ln 2 token through: s_0 = 2^1/2 and both tokens get -s_0 / 2 / 2
    lp = _leaf(LOGPROBS)
    wide = grpo_loss(
        lp,
        OLD,
        ADV,
        MASK,
        settings=LossSettings(loss_type="gmpo", gmpo_clip_eps=0.7, aggregation="seq_mean_token_mean", tis_cap=None),
    )
    assert float(wide.clip_fraction) == 0.0
    wide.loss.backward()
    r2 = math.sqrt(2.0)
    torch.testing.assert_close(lp.grad, torch.tensor([[-r2 / 4, -r2 / 4, 0.0], [0.5 / 2, 0.0, 0.0]]))


def test_gmpo_averages_a_per_token_advantage_over_the_answer():
    # Advantages [1, 3] on one answer at ratio 1: A_i = 2, s = 1, loss -2, gradient -2 / 2 per token.
    old = torch.full((1, 2), -1.0)
    lp = _leaf(old)
    out = grpo_loss(
        lp,
        old,
        torch.tensor([[1.0, 3.0]]),
        torch.ones(1, 2),
        settings=LossSettings(loss_type="gmpo", aggregation="seq_mean_token_mean", tis_cap=None),
    )
    assert float(out.loss.detach()) == pytest.approx(-2.0)
    out.loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.0, -1.0]]))


def test_settings_from_config_carry_the_new_keys():
    from grpo_rl.config.schema import PolicyConfig, SamplingConfig

    policy = PolicyConfig(
        loss_type="sapo",
        sapo_temperature_pos=2.0,
        sapo_temperature_neg=3.0,
        gmpo_clip_eps=0.3,
        engine_correction="token_band_mask",
        engine_correction_min=0.5,
        engine_correction_max=5.0,
    )
    s = LossSettings.from_config(policy, SamplingConfig())
    assert (s.loss_type, s.aggregation) == ("sapo", "seq_mean_token_mean")
    assert (s.sapo_temperature_pos, s.sapo_temperature_neg, s.gmpo_clip_eps) == (2.0, 3.0, 0.3)
    assert (s.engine_correction, s.engine_correction_min, s.engine_correction_max) == ("token_band_mask", 0.5, 5.0)
    gmpo = LossSettings.from_config(PolicyConfig(loss_type="gmpo"), SamplingConfig())
    assert (gmpo.loss_type, gmpo.aggregation, gmpo.gmpo_clip_eps) == ("gmpo", "seq_mean_token_mean", 0.4)
