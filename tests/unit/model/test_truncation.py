"""Scoring under the engine's sampling truncation (top-k, top-p): grpo_rl.model.vocab, grpo_rl.model.logprobs, the loss
mask, and the engine/learner ratio on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_rl.algo.loss import LossSettings, grpo_loss
from grpo_rl.errors import ConfigError
from grpo_rl.model.logprobs import sequence_logprobs
from grpo_rl.model.vocab import (
    TOP_P_CANDIDATES,
    ChunkedTokenLogprob,
    TruncatedTokenLogprob,
    token_logprobs,
    top_p_threshold_sorted,
    truncation_threshold,
)
from grpo_rl.run.preflight import validate
from tests.unit.helpers import compose_config

CPU = torch.device("cpu")


def _vllm_apply_top_k_top_p(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """vLLM v1's ``apply_top_k_top_p_pytorch`` (sort path) for one k and p over all rows, written out."""
    logits = logits.clone()
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k:
        kk = torch.full(logits.shape[:1], k, dtype=torch.long)
        top_k_mask = logits_sort.gather(1, (logits_sort.size(1) - kk).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < top_k_mask, -float("inf"))
    if p < 1.0:
        pp = torch.full(logits.shape[:1], p, dtype=torch.float32)
        probs_sum = torch.cumsum(logits_sort.softmax(dim=-1), dim=-1)
        top_p_mask = probs_sum <= 1 - pp.unsqueeze(dim=1)
        top_p_mask[:, -1] = False
        logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)


def _head(logits_row_major: torch.Tensor) -> tuple[torch.Tensor, torch.nn.Linear]:
    """``hidden``, ``head`` with ``head(hidden) == logits``: identity hidden states over a ``[V, T]`` weight."""
    t, v = logits_row_major.shape
    head = torch.nn.Linear(t, v, bias=False)
    with torch.no_grad():
        head.weight.copy_(logits_row_major.t())
    return torch.eye(t), head


def _inputs(t=37, h=16, v=101, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(t, h, generator=g).mul_(scale).requires_grad_()
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    return hidden, weight, g


def _sample_inside(z: torch.Tensor, top_p: float, top_k: int, g: torch.Generator) -> torch.Tensor:
    """One target per row drawn from the truncated distribution (so inside the kept set)."""
    kept = _vllm_apply_top_k_top_p(z.detach(), top_k, top_p)
    return torch.multinomial(kept.softmax(-1), 1, generator=g).squeeze(-1)


def test_top_k_renormalises_over_the_two_largest():
    logits = torch.tensor([[1.0, 3.0, 0.5, 2.0, -1.0]])
    hidden, head = _head(logits)
    for target, want in ((1, 3.0), (3, 2.0)):
        lp, ent, outside = token_logprobs(hidden, head, torch.tensor([target]), top_k=2, with_entropy=True)
        expected = want - math.log(math.exp(3.0) + math.exp(2.0))
        assert lp.item() == pytest.approx(expected, abs=1e-6)
        assert not outside.item()
        p = torch.tensor([3.0, 2.0]).softmax(0)
        assert ent.item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)


def test_top_p_keeps_the_smallest_set_holding_p():
    # probabilities 0.5, 0.25, 0.15, 0.07, 0.03 (in a shuffled order): top_p = 0.8 keeps the three largest
    # (0.5 + 0.25 = 0.75 < 0.8 is not enough, 0.5 + 0.25 + 0.15 is); top_p = 0.7 keeps two; 0.4 keeps one.
    probs = torch.tensor([0.15, 0.5, 0.03, 0.25, 0.07])
    z = probs.log().unsqueeze(0)
    for top_p, kept in ((0.8, {0, 1, 3}), (0.7, {1, 3}), (0.4, {1}), (0.99, {0, 1, 2, 3, 4})):
        thr = truncation_threshold(z, top_p, 0)
        assert set(torch.nonzero(z[0] >= thr[0]).flatten().tolist()) == kept, top_p
        hidden, head = _head(z)
        lp, _, outside = token_logprobs(hidden, head, torch.tensor([1]), top_p=top_p)
        assert lp.item() == pytest.approx(math.log(0.5 / sum(float(probs[i]) for i in kept)), abs=1e-6)
        assert not outside.item()


@pytest.mark.parametrize("top_k", [0, 1, 3, 17, 101, 500])
@pytest.mark.parametrize("top_p", [1.0, 0.95, 0.9, 0.5, 0.1])
def test_kept_set_matches_vllm_rule(top_p, top_k):
    g = torch.Generator().manual_seed(top_k * 7 + int(top_p * 100))
    z = torch.randn(64, 101, generator=g) * torch.rand(64, 1, generator=g) * 6  # flat to peaked rows
    want = _vllm_apply_top_k_top_p(z, top_k if top_k < 101 else 0, top_p) > float("-inf")
    got = z >= truncation_threshold(z, top_p, top_k).unsqueeze(-1)
    assert torch.equal(got, want)


def test_cumulative_mass_equal_to_one_minus_p_is_dropped():
    # vLLM drops a token when the ascending cumulative sum up to it is <= 1 - p, equality included. Find top_p
    # values that hit a row's cumulative sums exactly (in fp32, as vLLM forms 1 - p) and compare the sorted form
    # (which sums in vLLM's order) at those.
    g = torch.Generator().manual_seed(3)
    z = torch.randn(16, 33, generator=g) * 2
    hits = 0
    for row in range(z.shape[0]):
        zr = z[row : row + 1]
        cum = zr.sort(-1).values.softmax(-1).cumsum(-1)[0]  # [V], as both functions compute it for this row
        for j in range(z.shape[1] - 1):
            top_p = float(1.0 - cum[j].double())
            for cand in (top_p, math.nextafter(top_p, 0.0), math.nextafter(top_p, 1.0)):
                if 0 < cand < 1 and float(1 - torch.tensor(cand, dtype=torch.float32)) == float(cum[j]):
                    want = _vllm_apply_top_k_top_p(zr, 0, cand) > float("-inf")
                    got = zr >= top_p_threshold_sorted(zr.sort(-1).values, cand).unsqueeze(-1)
                    assert torch.equal(got, want)
                    assert int(want.sum()) == int((cum > cum[j]).sum())  # the token at the boundary is dropped
                    hits += 1
                    break
    assert hits >= 10


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p_candidates_and_the_full_sort_agree(top_p):
    # Rows from peaked (the kept set among the first candidates) to flat (more than the last candidates kept: sorted
    # whole).
    g = torch.Generator().manual_seed(int(top_p * 100))
    small, large = TOP_P_CANDIDATES
    z = torch.randn(64, 3 * large, generator=g)
    z[:40] *= 10.0  # peaked: a few tokens
    z[40:48] *= 0.1
    z[40:48, :1000] += 8.0  # about a thousand tokens hold the mass
    z[48:] *= 0.03  # flat: most of the vocabulary
    fast = z >= truncation_threshold(z, top_p, 0).unsqueeze(-1)
    full = z >= top_p_threshold_sorted(z.sort(-1).values, top_p).unsqueeze(-1)
    assert torch.equal(fast, full)
    kept = fast.sum(-1)
    assert (kept < small).any() and ((kept >= small) & (kept < large)).any() and (kept >= large).any()  # every tier


def test_matches_vllm_own_function():
    topk_topp = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    g = torch.Generator().manual_seed(5)
    z = torch.randn(32, 257, generator=g) * 3
    for top_k, top_p in ((0, 0.9), (20, 1.0), (20, 0.8), (5, 0.5)):
        k = torch.full((32,), top_k, dtype=torch.long) if top_k else None
        p = torch.full((32,), top_p, dtype=torch.float32) if top_p < 1 else None
        want = topk_topp.apply_top_k_top_p_pytorch(z.clone(), k, p) > float("-inf")
        got = z >= truncation_threshold(z, top_p, top_k).unsqueeze(-1)
        assert torch.equal(got, want), (top_k, top_p)


def _dense_truncated(hidden, weight, targets, temperature, top_p, top_k):
    """The explicit masked log-softmax (the kept set a constant), with autograd."""
    z = (hidden @ weight.t()).float() / temperature
    keep = _vllm_apply_top_k_top_p(z.detach(), top_k, top_p) > float("-inf")
    zk = z.masked_fill(~keep, float("-inf"))
    logprob = zk.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    p = zk.softmax(-1)
    entropy = torch.logsumexp(zk, -1) - (p * z).sum(-1)
    return logprob, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("top_p,top_k", [(0.9, 0), (1.0, 5), (0.8, 12)])
@pytest.mark.parametrize("chunk", [1, 8, 64])
def test_values_and_gradients_match_the_masked_log_softmax(temperature, top_p, top_k, chunk):
    hidden, weight, g = _inputs(scale=0.3)
    with torch.no_grad():
        targets = _sample_inside((hidden @ weight.t()) / temperature, top_p, top_k, g)
    up_lp, up_ent = torch.randn(hidden.shape[0], generator=g), torch.randn(hidden.shape[0], generator=g)
    lp, ent, outside = TruncatedTokenLogprob.apply(
        hidden, weight, targets, temperature, True, chunk, True, top_p, top_k
    )
    assert not outside.any()
    ((lp * up_lp).sum() + (ent * up_ent).sum()).backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref_lp, ref_ent = _dense_truncated(hidden, weight, targets, temperature, top_p, top_k)
    ((ref_lp * up_lp).sum() + (ref_ent * up_ent).sum()).backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gh, hidden.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw, weight.grad, atol=1e-4, rtol=1e-4)


BF16_UNIT_ROUNDOFF = 2.0**-8  # bf16 keeps 8 significant bits: round to nearest is within 2^-8 relative
FP32_SUM = 2.0**-20  # a bound on an fp32 sum's relative error over up to 16 terms (16 x 2^-24), of sum |terms|


def test_bf16_autocast_backward_is_within_bf16_rounding_of_the_exact_gradient():
    """Under bf16 autocast the truncated head's backward runs its matmuls in bf16: the log-prob and both gradients
    are within the error bf16 rounding allows of the float64 masked log-softmax of the same bf16-rounded inputs.

    The bound follows the arithmetic, every bf16 matmul accumulating in fp32 and rounding its output once (AVX2,
    avx512_bf16 and AMX alike): each logit is off by at most ``u |z|`` (``u = 2^-8``) plus the fp32 sum's error
    (``2^-20 sum_j |h_j w_j|`` for 16 terms), so a log-prob by twice the row's largest such error ``d``, each
    probability by a relative ``2 d``; the logit gradient ``g (onehot - p) / T`` is then rounded to bf16 (``u``),
    and each gradient matmul rounds its output once more. The kept set is top-k's, and the test checks that no
    logit lies near its edge, so rounding cannot move a token across it."""
    u, temperature, top_k = BF16_UNIT_ROUNDOFF, 0.7, 5
    hidden, weight, g = _inputs(t=12, h=16, v=64, seed=20, scale=0.5)
    hb, wb = hidden.detach().bfloat16().double(), weight.detach().bfloat16().double()  # what autocast multiplies
    z = hb @ wb.t() / temperature  # [T, V] exact logits of the rounded inputs
    z_err = u * z.abs() + FP32_SUM * (hb.abs() @ wb.abs().t()) / temperature  # [T, V] bound on a bf16 logit's error
    d = z_err.max(-1).values  # [T]
    top = z.topk(top_k + 1, dim=-1).values  # [T, k + 1]
    assert bool((top[:, top_k - 1] - top[:, top_k] > 2 * d).all()), "a logit near the top-k edge: pick another seed"
    targets = _sample_inside(z.float(), 1.0, top_k, g)
    upstream = torch.randn(hidden.shape[0], generator=g)  # [T]

    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _, outside = TruncatedTokenLogprob.apply(hidden, weight, targets, temperature, False, 5, False, 1.0, top_k)
    (lp * upstream).sum().backward()  # 12 tokens in chunks of 5: a short last chunk

    keep = z >= top[:, top_k - 1 : top_k]  # [T, V]
    hb_, wb_ = hb.clone().requires_grad_(), wb.clone().requires_grad_()
    ref = (hb_ @ wb_.t() / temperature).masked_fill(~keep, float("-inf")).log_softmax(-1)  # [T, V]
    ref_lp = ref.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [T]
    (ref_lp * upstream.double()).sum().backward()
    p = ref.detach().exp()  # [T, V], 0 off the kept set
    gz = upstream.double().unsqueeze(-1) * (torch.nn.functional.one_hot(targets, 64).double() - p) / temperature
    g_abs = upstream.double().abs().unsqueeze(-1)  # [T, 1]
    # [T, V]: p's relative error 2 d (and fp32's own), then the rounding of the logit gradient to bf16
    gz_err = g_abs * p * 2 * d.unsqueeze(-1) / temperature + u * gz.abs() + FP32_SUM * g_abs
    lp_tol = 2 * d
    gh_tol = gz_err @ wb.abs() + u * (gz @ wb).abs() + FP32_SUM * (gz.abs() @ wb.abs())  # [T, H]
    # [V, H]: one rounded product per chunk (of 5, 5 and 2 tokens), summed in fp32
    chunks_rounding = sum(u * (gz[s : s + 5].t() @ hb[s : s + 5]).abs() for s in (0, 5, 10))
    gw_tol = gz_err.t() @ hb.abs() + chunks_rounding + FP32_SUM * (gz.abs().t() @ hb.abs())

    assert lp.dtype == hidden.grad.dtype == weight.grad.dtype == torch.float32 and not outside.any()
    for got, want, tol in (
        (lp.detach(), ref_lp.detach(), lp_tol),
        (hidden.grad, hb_.grad, gh_tol),
        (weight.grad, wb_.grad, gw_tol),
    ):
        error = (got.double() - want).abs()
        # twice the first-order bound: the products of two errors are left out of it
        assert bool((error <= 2 * tol).all()), f"{float((error / tol).max()):.2f} times the bf16 bound"
        assert float((tol / want.abs().clamp_min(1e-3)).median()) < 0.2  # far below the values: a wrong one fails


def test_plain_head_path_matches_the_chunked_path():
    hidden, weight, g = _inputs(scale=0.3)
    with torch.no_grad():
        targets = _sample_inside(hidden @ weight.t(), 0.9, 7, g)
    targets[0] = int((hidden[0] @ weight.t()).argmin())  # one outside
    lp, ent, out = TruncatedTokenLogprob.apply(hidden, weight, targets, 0.8, True, 8, False, 0.9, 7)
    lp.sum().backward()
    gw = weight.grad.clone()
    weight.grad = None
    head = torch.nn.Linear(16, 101, bias=True)  # a bias takes the plain path; a zero bias gives the same logits
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.zero_()
    plp, pent, pout = token_logprobs(hidden, head, targets, temperature=0.8, with_entropy=True, top_p=0.9, top_k=7)
    plp.sum().backward()
    torch.testing.assert_close(plp, lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pent.detach(), ent, atol=1e-4, rtol=1e-4)
    assert torch.equal(pout, out) and bool(out[0])
    torch.testing.assert_close(head.weight.grad, gw, atol=1e-4, rtol=1e-4)


def test_target_outside_the_kept_set_is_finite_and_flagged():
    logits = torch.tensor([[4.0, 3.0, 0.0, -2.0, 1.0]])
    hidden, head = _head(logits)
    hidden.requires_grad_()
    lp, ent, outside = token_logprobs(hidden, head, torch.tensor([3]), top_k=2, with_entropy=True, entropy_grad=True)
    assert bool(outside.item())
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    # the stand-in is the untruncated log-prob
    assert lp.item() == pytest.approx(float(logits.log_softmax(-1)[0, 3]), abs=1e-6)
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(head.weight.grad).all()


def test_no_truncation_is_the_untouched_path():
    hidden, weight, g = _inputs()
    targets = torch.randint(0, 101, (37,), generator=g)
    head = torch.nn.Linear(16, 101, bias=False)
    with torch.no_grad():
        head.weight.copy_(weight)
    lp, ent, outside = token_logprobs(hidden, head, targets, temperature=0.7, with_entropy=True)
    ref_lp, ref_ent = ChunkedTokenLogprob.apply(hidden, head.weight, targets, 0.7, True, (1 << 24) // 101)
    assert outside is None
    assert torch.equal(lp, ref_lp) and torch.equal(ent, ref_ent)
    # the plain path, against the formula it had before truncation existed
    biased = torch.nn.Linear(16, 101, bias=True)
    lp, ent, outside = token_logprobs(hidden, biased, targets, temperature=0.7, with_entropy=True)
    logits = biased(hidden).float() / 0.7
    logz = torch.logsumexp(logits, dim=-1)
    assert outside is None
    assert torch.equal(lp, logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz)
    assert torch.equal(ent, logz - (torch.softmax(logits, dim=-1) * logits).sum(-1))


def test_outside_tokens_carry_no_policy_or_kl_gradient():
    g = torch.Generator().manual_seed(0)
    logprobs = (torch.randn(2, 4, generator=g) - 2).requires_grad_()
    mask = torch.ones(2, 4)
    outside = torch.zeros(2, 4, dtype=torch.bool)
    outside[0, 1] = outside[1, 3] = True
    out = grpo_loss(
        logprobs,
        logprobs.detach() + 0.1,
        torch.tensor([1.0, -1.0]),
        mask,
        ref_logprobs=logprobs.detach() - 0.3,
        behavior_logprobs=logprobs.detach() + 0.05,
        outside=outside,
        settings=LossSettings(kl_coef=0.1),
    )
    out.loss.backward()
    assert (logprobs.grad[outside] == 0).all() and (logprobs.grad[~outside] != 0).all()
    assert float(out.truncation_masked_fraction) == pytest.approx(2 / 8)
    # without outside tokens the argument changes nothing
    lp2 = logprobs.detach().clone().requires_grad_()
    common = dict(
        settings=LossSettings(kl_coef=0.1), ref_logprobs=lp2.detach() - 0.3, behavior_logprobs=lp2.detach() + 0.05
    )
    a = grpo_loss(lp2, lp2.detach() + 0.1, torch.tensor([1.0, -1.0]), mask, **common)
    b = grpo_loss(
        lp2, lp2.detach() + 0.1, torch.tensor([1.0, -1.0]), mask, outside=torch.zeros(2, 4, dtype=torch.bool), **common
    )
    assert a.diagnostics() == b.diagnostics()


def test_negative_top_k_is_a_config_error():
    cfg = compose_config(["sampling.top_k=-1"])
    with pytest.raises(ConfigError, match="sampling.top_k"):
        validate(cfg)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from grpo_rl.engines.transformers_engine import TransformersEngine

    eng = TransformersEngine(str(tiny_model_dir), CPU)
    yield eng
    eng.shutdown()


@pytest.mark.parametrize("share_prompt", [False, True])
@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 0.9, 0), (0.7, 0.9, 0), (1.0, 1.0, 50), (1.0, 0.95, 200)])
def test_engine_and_learner_agree_under_truncation(engine, tiny_model, temperature, top_p, top_k, share_prompt):
    from grpo_rl.engines.base import SamplingSpec

    prompts = [[1, 9690, 198, 22, 23, 24, 25], [1, 4093, 198]]
    batch = engine.generate(
        prompts, 4, SamplingSpec(max_new_tokens=8, temperature=temperature, top_p=top_p, top_k=top_k, seed=11)
    )
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        out = sequence_logprobs(
            tiny_model, batch, temperature=temperature, top_p=top_p, top_k=top_k, share_prompt=share_prompt
        )
        plain = sequence_logprobs(tiny_model, batch, temperature=temperature, share_prompt=share_prompt).logprobs
    ratio = (out.logprobs - batch["behavior_logprobs"])[mask].exp()
    assert abs(float(ratio.mean()) - 1.0) < 1e-3
    assert float(out.outside[mask].float().mean()) < 0.05
    untruncated = (plain - batch["behavior_logprobs"])[mask].exp()
    assert float(untruncated.mean()) < 0.95  # the test can fail: scoring without the truncation is biased low


def test_learner_masks_outside_tokens(tiny_model, engine):
    from grpo_rl.engines.base import SamplingSpec
    from grpo_rl.training.learner import Learner, LossSettings

    batch = engine.generate([[1, 9690, 198, 22]], 4, SamplingSpec(max_new_tokens=6, top_k=50, seed=3))
    batch.set("advantage", torch.tensor([1.0, -1.0, 0.5, -0.5]))
    # A policy that moved: perturb the learner's weights so that some sampled tokens leave its top-50 set.
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    learner = Learner(tiny_model, CPU, LossSettings(top_k=50, tis_cap=None), lr=1e-3)
    metrics = learner.train_step(batch)
    assert 0 < metrics["truncation_masked_fraction"] <= 1
    assert math.isfinite(metrics["grad_norm"]) and metrics["step_skipped"] == 0
