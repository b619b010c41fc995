"""Tests for the policy objectives (GSPO, GSPO-token, CISPO), the engine correction modes, the entropy bonus and
the k3 clamp, against values computed by hand from the formulas in the modules' docstrings."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_rl.algo.engine_correction import ENGINE_CORRECTIONS, engine_weights
from grpo_rl.algo.loss import LossSettings, grpo_loss, kl_estimate
from grpo_rl.algo.objectives import POLICY_OBJECTIVES, sequence_log_ratio
from grpo_rl.config import schema as config

LN2, LN3 = math.log(2.0), math.log(3.0)
SQRT2 = math.sqrt(2.0)
# Row 0 has 2 answer tokens with log-ratios [ln 2, 0]: s_0 = exp(ln 2 / 2) = sqrt(2). Row 1 has 1 token with
# log-ratio -ln 2: s_1 = 0.5. The padding's log-ratio (5.0) must not count.
OLD = torch.full((2, 3), -2.0)
LOGPROBS = OLD + torch.tensor([[LN2, 0.0, 5.0], [-LN2, 5.0, 5.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.clone().requires_grad_(True)


# --------------------------------------------------------------------------- GSPO


def test_sequence_log_ratio_is_the_mean_over_answer_tokens():
    got = sequence_log_ratio(LOGPROBS - OLD, MASK)
    torch.testing.assert_close(got, torch.tensor([[LN2 / 2], [-LN2]]))


def test_gspo_clips_the_sequence_ratio():
    # eps 0.2 / 0.28: s_0 = 1.414 > 1.28 with A = +1 -> -1.28; s_1 = 0.5 < 0.8 with A = -1 -> +0.8.
    lp = _leaf(LOGPROBS)
    out = grpo_loss(
        lp,
        OLD,
        torch.tensor([1.0, -1.0]),
        MASK,
        settings=LossSettings(
            loss_type="gspo", clip_eps_low=0.2, clip_eps_high=0.28, aggregation="seq_mean_token_mean", tis_cap=None
        ),
    )
    assert float(out.loss_policy.detach()) == pytest.approx((-1.28 + 0.8) / 2)
    assert float(out.clip_fraction) == 1.0  # every token of both (clipped) answers
    assert float(out.ratio_mean) == pytest.approx((2 * SQRT2 + 0.5) / 3, abs=1e-6)  # per token, s repeated
    out.loss.backward()
    assert torch.count_nonzero(lp.grad) == 0  # both answers clipped: no gradient


def test_gspo_gradient_spreads_the_sequence_ratio_over_the_answer():
    # Unclipped (eps 0.6): loss = mean_i(-A_i s_i), d/d logp_t = -A_i s_i / |y_i| / B.
    lp = _leaf(LOGPROBS)
    out = grpo_loss(
        lp,
        OLD,
        torch.tensor([1.0, -1.0]),
        MASK,
        settings=LossSettings(
            loss_type="gspo", clip_eps_low=0.6, clip_eps_high=0.6, aggregation="seq_mean_token_mean", tis_cap=None
        ),
    )
    assert float(out.loss_policy.detach()) == pytest.approx((-SQRT2 + 0.5) / 2, abs=1e-6)
    assert float(out.clip_fraction) == 0.0
    out.loss.backward()
    expected = torch.tensor([[-SQRT2 / 2 / 2, -SQRT2 / 2 / 2, 0.0], [0.5 / 2, 0.0, 0.0]])
    torch.testing.assert_close(lp.grad, expected)


def test_gspo_differs_from_token_level_grpo():
    # Token ratios [2, 1] of row 0: GRPO clips the first token (A > 0, 2 > 1.28), GSPO clips the whole answer.
    adv = torch.tensor([1.0, -1.0])
    kw = dict(clip_eps_low=0.2, clip_eps_high=0.28, aggregation="seq_mean_token_mean", tis_cap=None)
    grpo = grpo_loss(LOGPROBS, OLD, adv, MASK, settings=LossSettings(loss_type="grpo", **kw))
    assert float(grpo.loss_policy) == pytest.approx(((-1.28 - 1.0) / 2 + 0.8) / 2)
    assert float(grpo.clip_fraction) == pytest.approx(2 / 3)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
def test_gspo_token_equals_gspo_with_one_advantage_per_answer(aggregation):
    adv = torch.tensor([1.0, -1.0])
    kw = dict(clip_eps_low=0.6, clip_eps_high=0.6, aggregation=aggregation, tis_cap=None)
    a, b = _leaf(LOGPROBS), _leaf(LOGPROBS)
    seq = grpo_loss(a, OLD, adv, MASK, settings=LossSettings(loss_type="gspo", **kw))
    tok = grpo_loss(b, OLD, adv, MASK, settings=LossSettings(loss_type="gspo_token", **kw))
    assert float(tok.loss.detach()) == pytest.approx(float(seq.loss.detach()), abs=1e-6)
    assert float(tok.ratio_mean) == pytest.approx(float(seq.ratio_mean), abs=1e-6)
    seq.loss.backward()
    tok.loss.backward()
    torch.testing.assert_close(b.grad, a.grad)


def test_gspo_token_takes_per_token_advantages():
    # One answer, log-ratios [ln 2, 0]: value s = sqrt(2) on both tokens; gradient per token -A_t s / |y|.
    old = torch.full((1, 2), -1.0)
    mask = torch.ones(1, 2)
    adv = torch.tensor([[1.0, 3.0]])
    kw = dict(clip_eps_low=0.6, clip_eps_high=0.6, aggregation="seq_mean_token_mean", tis_cap=None)
    lp = _leaf(old + torch.tensor([[LN2, 0.0]]))
    out = grpo_loss(lp, old, adv, mask, settings=LossSettings(loss_type="gspo_token", **kw))
    assert float(out.loss.detach()) == pytest.approx(-(SQRT2 * 1 + SQRT2 * 3) / 2, abs=1e-6)
    out.loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-SQRT2 / 2, -3 * SQRT2 / 2]]))
    # Sequence-level GSPO sends the mean advantage to every token instead.
    lp2 = _leaf(old + torch.tensor([[LN2, 0.0]]))
    grpo_loss(lp2, old, adv, mask, settings=LossSettings(loss_type="gspo", **kw)).loss.backward()
    torch.testing.assert_close(lp2.grad, torch.tensor([[-SQRT2, -SQRT2]]))


# --------------------------------------------------------------------------- CISPO


def test_cispo_clips_the_weight_but_keeps_every_gradient():
    # Ratios [3, 0.5], A = +1: weights clip(r, max=2) = [2, 0.5]; loss_t = -w A logp_t; grad = -w A / n.
    old = torch.full((1, 2), -1.0)
    logprobs = old + torch.tensor([[LN3, -LN2]])
    lp = _leaf(logprobs)
    out = grpo_loss(
        lp,
        old,
        torch.ones(1),
        torch.ones(1, 2),
        settings=LossSettings(loss_type="cispo", cispo_ratio_max=2.0, tis_cap=None),
    )
    expected = (-2.0 * (-1.0 + LN3) - 0.5 * (-1.0 - LN2)) / 2
    assert float(out.loss_policy.detach()) == pytest.approx(expected, abs=1e-6)
    assert float(out.clip_fraction) == 0.5  # the ratio-3 token's weight was cut
    out.loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.0, -0.25]]))  # the clipped token still has one

    lp = _leaf(logprobs)
    low = grpo_loss(
        lp,
        old,
        torch.ones(1),
        torch.ones(1, 2),
        settings=LossSettings(loss_type="cispo", cispo_ratio_max=2.0, cispo_ratio_min=0.8, tis_cap=None),
    )
    assert float(low.clip_fraction) == 1.0
    low.loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.0, -0.4]]))


def test_cispo_at_ratio_one_has_grpos_gradient():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]])
    adv = torch.tensor([1.0, -2.0])
    grads = []
    for loss_type in ("grpo", "cispo"):
        lp = _leaf(logprobs)
        out = grpo_loss(lp, lp.detach(), adv, MASK, settings=LossSettings(loss_type=loss_type, tis_cap=None))
        out.loss.backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[1], grads[0])
    torch.testing.assert_close(grads[0], torch.tensor([[-1 / 3, -1 / 3, 0.0], [2 / 3, 0.0, 0.0]]))


def test_unknown_objective_raises():
    with pytest.raises(ValueError, match="gspo_token"):
        grpo_loss(LOGPROBS, OLD, torch.ones(2), MASK, settings=LossSettings(loss_type="ppo"))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- engine correction

# One answer of three tokens with engine weights pi_old / mu = [3, 1.5, 0.25]; ratio 1, A = +1, so the token
# loss is -w and the token mean -sum(w) / 3.
E_OLD = torch.full((1, 3), -1.0)
E_BEHAVIOR = E_OLD - torch.tensor([[LN3, math.log(1.5), math.log(0.25)]])
E_MASK = torch.ones(1, 3)


@pytest.mark.parametrize(
    ("mode", "low", "weights", "outside", "masked"),
    [
        ("token_truncate", None, [2.0, 1.5, 0.25], 1 / 3, 0.0),  # today's default: only the cap
        ("token_truncate", 0.5, [2.0, 1.5, 0.5], 2 / 3, 0.0),
        ("token_mask", 0.5, [0.0, 1.5, 0.0], 2 / 3, 2 / 3),
        ("token_mask", None, [0.0, 1.5, 0.25], 1 / 3, 1 / 3),
    ],
)
def test_token_level_engine_correction(mode, low, weights, outside, masked):
    out = grpo_loss(
        E_OLD.clone(),
        E_OLD,
        torch.ones(1),
        E_MASK,
        behavior_logprobs=E_BEHAVIOR,
        settings=LossSettings(tis_cap=2.0, engine_correction=mode, engine_correction_min=low),
    )
    assert float(out.loss.detach()) == pytest.approx(-sum(weights) / 3, abs=1e-6)
    assert float(out.tis_fraction) == pytest.approx(outside)
    assert float(out.engine_masked_fraction) == pytest.approx(masked)
    # ESS of the applied weights over 3 tokens
    ess = sum(weights) ** 2 / (sum(w * w for w in weights) * 3)
    assert float(out.ess) == pytest.approx(ess, abs=1e-6)


def test_engine_diagnostics_quantiles_and_kl():
    out = grpo_loss(
        E_OLD.clone(), E_OLD, torch.ones(1), E_MASK, behavior_logprobs=E_BEHAVIOR, settings=LossSettings(tis_cap=2.0)
    )
    # torch.quantile interpolates linearly between the sorted weights [0.25, 1.5, 3] at positions q * 2.
    assert float(out.engine_weight_p5) == pytest.approx(0.25 + 0.1 * 1.25, abs=1e-6)
    assert float(out.engine_weight_p50) == pytest.approx(1.5, abs=1e-6)
    assert float(out.engine_weight_p95) == pytest.approx(1.5 + 0.9 * 1.5, abs=1e-6)
    # k3 of KL(engine || old) on engine samples: log r = behavior - old = -log w, k3 = w - 1 - log w.
    kl = sum(w - 1 - math.log(w) for w in (3.0, 1.5, 0.25)) / 3
    assert float(out.kl_engine) == pytest.approx(kl, abs=1e-6)
    # Reported with the correction off too, the loss then unweighted.
    off = grpo_loss(
        E_OLD.clone(), E_OLD, torch.ones(1), E_MASK, behavior_logprobs=E_BEHAVIOR, settings=LossSettings(tis_cap=None)
    )
    assert float(off.loss.detach()) == pytest.approx(-1.0)
    assert float(off.engine_weight_p50) == pytest.approx(1.5, abs=1e-6)
    assert float(off.kl_engine) == pytest.approx(kl, abs=1e-6)
    # Without behaviour log-probs there is nothing to report: weights 1, KL 0.
    none = grpo_loss(E_OLD.clone(), E_OLD, torch.ones(1), E_MASK)
    assert (float(none.engine_weight_p5), float(none.engine_weight_p95), float(none.kl_engine)) == (1.0, 1.0, 0.0)


# Two answers: row 0's token weights [2, 0.75] multiply to 1.5, row 1's single weight is 0.25; the padding's
# log-ratio (ln 100) must not count.
S_OLD = torch.full((2, 2), -1.0)
S_BEHAVIOR = S_OLD - torch.tensor([[LN2, math.log(0.75)], [math.log(0.25), math.log(100.0)]])
S_MASK = torch.tensor([[1, 1], [1, 0]])


@pytest.mark.parametrize(
    ("mode", "cap", "low", "row_weights", "outside", "masked"),
    [
        ("sequence_truncate", 2.0, 0.5, [1.5, 0.5], 1 / 3, 0.0),
        ("sequence_truncate", 1.2, None, [1.2, 0.25], 2 / 3, 0.0),
        ("sequence_mask", 2.0, 0.5, [1.5, 0.0], 1 / 3, 1 / 3),
        ("sequence_mask", 1.2, None, [0.0, 0.25], 2 / 3, 2 / 3),
    ],
)
def test_sequence_level_engine_correction(mode, cap, low, row_weights, outside, masked):
    out = grpo_loss(
        S_OLD.clone(),
        S_OLD,
        torch.ones(2),
        S_MASK,
        behavior_logprobs=S_BEHAVIOR,
        settings=LossSettings(tis_cap=cap, engine_correction=mode, engine_correction_min=low),
    )
    # token mean of -w over the 3 answer tokens, row 0's weight on both of its tokens
    assert float(out.loss.detach()) == pytest.approx(-(2 * row_weights[0] + row_weights[1]) / 3, abs=1e-6)
    assert float(out.tis_fraction) == pytest.approx(outside)
    assert float(out.engine_masked_fraction) == pytest.approx(masked)
    # quantiles are over the two answers' weights [0.25, 1.5]
    assert float(out.engine_weight_p50) == pytest.approx(0.875, abs=1e-6)
    assert float(out.engine_weight_p95) == pytest.approx(0.25 + 0.95 * 1.25, abs=1e-6)


def test_engine_weights_raw_is_per_answer_at_the_sequence_level():
    w = engine_weights(S_OLD, S_BEHAVIOR, S_MASK, mode="sequence_truncate", cap=2.0)
    torch.testing.assert_close(w.raw, torch.tensor([[1.5], [0.25]]))
    assert w.weight_BT.shape == (2, 2)
    with pytest.raises(ValueError, match="token_truncate"):
        engine_weights(S_OLD, S_BEHAVIOR, S_MASK, mode="sequence")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- entropy bonus


def test_entropy_bonus_value_uses_the_loss_aggregation():
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    zeros = torch.zeros(2, 3)
    off = grpo_loss(zeros, zeros, torch.ones(2), MASK, entropy=entropy)
    assert float(off.loss_entropy.detach()) == 0.0
    tok = grpo_loss(zeros, zeros, torch.ones(2), MASK, entropy=entropy, settings=LossSettings(entropy_coef=0.1))
    assert float(tok.loss_entropy.detach()) == pytest.approx(-0.1 * (1 + 2 + 3) / 3)
    assert float(tok.loss.detach()) == pytest.approx(float(off.loss.detach()) - 0.2)
    seq = grpo_loss(
        zeros,
        zeros,
        torch.ones(2),
        MASK,
        entropy=entropy,
        scale=0.5,
        settings=LossSettings(entropy_coef=0.1, aggregation="seq_mean_token_mean"),
    )
    assert float(seq.loss_entropy.detach()) == pytest.approx(-0.1 * ((1 + 2) / 2 + 3) / 2 * 0.5)
    assert float(seq.entropy) == pytest.approx(2.0)  # the diagnostic stays a plain token mean


def test_entropy_bonus_gradient_is_hand_computable():
    # Two-token vocabulary, logits (0, x) with x = ln 3: p = (1/4, 3/4), H = -sum p log p,
    # dH/dx = -p1 (1 - p1) x = -(3/16) ln 3. Zero advantage, so the bonus is the only gradient.
    x = torch.tensor(LN3, requires_grad=True)
    logits = torch.stack([torch.zeros(()), x]).view(1, 1, 2)  # [B, T, V]
    logp_all = logits.log_softmax(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [1, 1]
    logprobs = logp_all[..., 1]  # [1, 1]
    out = grpo_loss(
        logprobs,
        logprobs.detach(),
        torch.zeros(1),
        torch.ones(1, 1),
        entropy=entropy,
        settings=LossSettings(entropy_coef=0.5),
    )
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert float(out.loss_entropy.detach()) == pytest.approx(-0.5 * h, abs=1e-6)
    out.loss.backward()
    assert float(x.grad) != 0.0
    assert float(x.grad) == pytest.approx(0.5 * (3 / 16) * LN3, abs=1e-6)


def test_entropy_bonus_needs_an_entropy_with_gradient():
    lp = _leaf(LOGPROBS)
    with pytest.raises(ValueError, match="entropy_grad=True"):
        grpo_loss(lp, OLD, torch.ones(2), MASK, entropy=torch.ones(2, 3), settings=LossSettings(entropy_coef=0.1))
    with pytest.raises(ValueError, match="with_entropy"):
        grpo_loss(lp, OLD, torch.ones(2), MASK, settings=LossSettings(entropy_coef=0.1))


# --------------------------------------------------------------------------- the k3 clamp


def test_k3_clamp_protects_tokens_the_reference_prefers_by_far():
    # ref - logprob = 30 > 20 is clamped: the value is e^20 - 1 - 20 and there is no gradient. The other way
    # round (the policy prefers the token by 30 nats) is not clamped: exp(-30) - 1 + 30.
    logprobs = torch.tensor([[-31.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -31.0]])
    kl = kl_estimate(logprobs, ref, "k3")
    torch.testing.assert_close(kl.detach(), torch.tensor([[math.exp(20) - 21, math.exp(-30) - 1 + 30]]))
    kl.sum().backward()
    assert float(logprobs.grad[0, 0]) == 0.0
    assert float(logprobs.grad[0, 1]) == pytest.approx(1 - math.exp(-30))


# --------------------------------------------------------------------------- names shared with the config


def test_config_names_match_the_loss_modules():
    """the config schema stays free of torch, so it spells the names out; they must agree with the modules'."""
    assert {objective for objective, _, _ in config.LOSS_TYPES.values()} == set(POLICY_OBJECTIVES)
    assert config.ENGINE_CORRECTIONS == ENGINE_CORRECTIONS


def test_overflowing_sequence_weight_is_bounded_and_its_quantiles_finite():
    # 100 tokens at log-weight 1 each: exp(100) overflows float32 to inf. Truncated it is the cap; the quantiles
    # report the float32 maximum rather than nan.
    old = torch.zeros(2, 100)
    behavior = old - 1.0
    out = grpo_loss(
        old.clone(),
        old,
        torch.ones(2),
        torch.ones(2, 100),
        behavior_logprobs=behavior,
        settings=LossSettings(tis_cap=2.0, engine_correction="sequence_truncate"),
    )
    assert float(out.loss) == pytest.approx(-2.0)
    assert float(out.tis_fraction) == 1.0
    assert float(out.engine_weight_p50) == torch.finfo(torch.float32).max
