"""Tests for grpo_rl.training.learner: micro-batching, gradient accumulation, skipped steps, LR warmup, state."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from tensordict import TensorDict

from grpo_rl.model.logprobs import sequence_logprobs
from grpo_rl.model.packing import micro_batches
from grpo_rl.training.learner import Learner, LossSettings

CPU = torch.device("cpu")


def make_batch(prompt_lens, response_lens, *, lp=None, lr=None, seed=0, vocab=1000) -> TensorDict:
    """Random tokens, prompts left-padded to ``lp``, answers right-padded to ``lr``; zero advantages."""
    g = torch.Generator().manual_seed(seed)
    n = len(prompt_lens)
    lp = lp or max(prompt_lens)
    lr = lr or max(response_lens)
    prompt_ids = torch.zeros(n, lp, dtype=torch.long)
    prompt_mask = torch.zeros(n, lp, dtype=torch.long)
    response_ids = torch.zeros(n, lr, dtype=torch.long)
    response_mask = torch.zeros(n, lr, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompt_ids[i, lp - p :] = torch.randint(1, vocab, (p,), generator=g)
        prompt_mask[i, lp - p :] = 1
        response_ids[i, :r] = torch.randint(1, vocab, (r,), generator=g)
        response_mask[i, :r] = 1
    return TensorDict(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "behavior_logprobs": -torch.rand(n, lr, generator=g) * response_mask,
            "advantage": torch.zeros(n),
        },
        batch_size=[n],
    )


# --------------------------------------------------------------------------- micro_batches


def test_micro_batches_respect_budget_and_trim_padding():
    # Padded widths: rows 0-1 need (5 + 4) * 2 = 18 > 16, rows 1-2 need (5 + 2) * 2 = 14, rows 1-3 (5 + 3) * 3 = 24.
    batch = make_batch([2, 5, 3, 1], [4, 1, 2, 3], lp=7, lr=6)
    batch["ref_logprobs"] = torch.randn(4, 6)
    chunks = micro_batches(batch, token_budget=16)
    assert [c.batch_size[0] for c in chunks] == [1, 2, 1]
    assert [tuple(c["prompt_ids"].shape) for c in chunks] == [(1, 2), (2, 5), (1, 1)]
    assert [tuple(c["response_ids"].shape) for c in chunks] == [(1, 4), (2, 2), (1, 3)]
    for c in chunks:
        for key in ("response_mask", "behavior_logprobs", "ref_logprobs"):
            assert c[key].shape == c["response_ids"].shape
        assert c["prompt_mask"].shape == c["prompt_ids"].shape
        if c.batch_size[0] > 1:
            assert c["prompt_ids"].numel() + c["response_ids"].numel() <= 16
    # Trimming drops only padding: every real token survives, in place.
    row = 0
    for c in chunks:
        for i in range(c.batch_size[0]):
            p, r = int(batch["prompt_mask"][row].sum()), int(batch["response_mask"][row].sum())
            assert c["prompt_ids"][i, -p:].tolist() == batch["prompt_ids"][row, -p:].tolist()
            assert c["response_ids"][i, :r].tolist() == batch["response_ids"][row, :r].tolist()
            assert c["behavior_logprobs"][i, :r].tolist() == batch["behavior_logprobs"][row, :r].tolist()
            assert c["advantage"][i] == batch["advantage"][row]
            row += 1
    assert row == 4


def test_micro_batches_large_budget_is_one_trimmed_chunk():
    batch = make_batch([2, 5, 3, 1], [4, 1, 2, 3], lp=9, lr=8)
    (chunk,) = micro_batches(batch, token_budget=10_000)
    assert chunk["prompt_ids"].shape == (4, 5)
    assert chunk["response_ids"].shape == (4, 4)


def test_micro_batches_row_over_budget_alone():
    batch = make_batch([6, 6], [6, 6])
    chunks = micro_batches(batch, token_budget=4)
    assert [c.batch_size[0] for c in chunks] == [1, 1]


# --------------------------------------------------------------------------- train_step


def _learner(model, **kw) -> Learner:
    loss = kw.pop("loss", LossSettings())
    kw.setdefault("lr", 1e-3)
    return Learner(model, CPU, loss, **kw)


def _capture_grads(learner: Learner) -> list[dict[str, torch.Tensor]]:
    """Record the gradients the optimizer is about to apply, at every step."""
    seen: list[dict[str, torch.Tensor]] = []

    def hook(optimizer, args, kwargs):
        seen.append({n: p.grad.detach().clone() for n, p in learner.model.named_parameters() if p.grad is not None})

    learner.optimizer.register_step_pre_hook(hook)
    return seen


def _accum_batch(tiny_model) -> TensorDict:
    batch = make_batch([3, 7, 5, 2, 6, 4], [5, 2, 6, 3, 1, 4], lp=8, lr=7, seed=1)
    batch["advantage"] = torch.tensor([1.0, -0.5, 0.8, -1.2, 0.3, 0.6])
    # Reference and behaviour log-probs near the model's own, as in training; one row's behaviour weight
    # exp(0.9) is capped at tis_cap=2.
    with torch.no_grad():
        own = sequence_logprobs(tiny_model, batch).logprobs
    noise = torch.rand(6, 7, generator=torch.Generator().manual_seed(2)) * 0.4 - 0.2
    batch["ref_logprobs"] = (own + noise) * batch["response_mask"]
    shift = torch.tensor([0.3, -0.2, 0.0, 0.9, -0.4, 0.1]).unsqueeze(-1)
    batch["behavior_logprobs"] = (own - shift) * batch["response_mask"]
    return batch


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_accumulated_gradient_equals_full_batch(tiny_model, aggregation):
    settings = LossSettings(aggregation=aggregation, kl_coef=0.05, max_tokens=7, tis_cap=2.0)
    batch = _accum_batch(tiny_model)
    grads, metrics = [], []
    for budget in (10_000, 20):  # one micro-batch, then five of 1, 1, 1, 2 and 1 rows
        learner = _learner(copy.deepcopy(tiny_model), loss=settings, max_grad_norm=0.0, micro_batch_tokens=budget)
        seen = _capture_grads(learner)
        metrics.append(learner.train_step(batch.clone()))
        grads.append(seen[0])
    assert metrics[0]["num_micro_batches"] == 1
    assert metrics[1]["num_micro_batches"] == 5
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)
    for key in ("loss", "loss_policy", "loss_kl"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-5, abs=1e-6), key
    assert metrics[0]["tis_fraction"] > 0
    assert metrics[1]["grad_norm"] == pytest.approx(metrics[0]["grad_norm"], rel=1e-4)


def test_non_finite_loss_skips_the_step(tiny_model):
    learner = _learner(tiny_model, micro_batch_tokens=24)
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    batch = make_batch([3, 4, 2, 5], [3, 2, 4, 1], seed=3)
    batch["advantage"] = torch.tensor([1.0, float("nan"), -1.0, 0.5])
    metrics = learner.train_step(batch)
    assert metrics["step_skipped"] == 1.0
    assert metrics["skipped_steps"] == 1.0
    assert learner.skipped_steps == 1
    assert learner.version == 0
    for k, v in tiny_model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in tiny_model.parameters())
    # the next good batch trains normally
    batch["advantage"] = torch.tensor([1.0, -1.0, -1.0, 0.5])
    metrics = learner.train_step(batch)
    assert metrics["step_skipped"] == 0.0
    assert learner.version == 1 and learner.skipped_steps == 1
    assert any(not torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_advantage_sign_moves_the_sequence_logprob(tiny_model, sign):
    batch = make_batch([4], [5], seed=4)
    batch["advantage"] = torch.tensor([sign])
    learner = _learner(tiny_model, lr=1e-3, loss=LossSettings(tis_cap=None))
    with torch.no_grad():
        before = float(sequence_logprobs(tiny_model, batch).logprobs.sum())
    learner.train_step(batch)
    with torch.no_grad():
        after = float(sequence_logprobs(tiny_model, batch).logprobs.sum())
    assert (after - before) * sign > 0.01
    assert learner.version == 1


def test_lr_warmup(tiny_model):
    learner = _learner(tiny_model, lr=1.0e-3, warmup_steps=4)
    used: list[float] = []
    learner.optimizer.register_step_pre_hook(lambda opt, a, k: used.append(opt.param_groups[0]["lr"]))
    batch = make_batch([2, 3], [2, 2], seed=5)
    batch["advantage"] = torch.tensor([1.0, -1.0])
    logged = [learner.train_step(batch)["lr"] for _ in range(5)]
    assert used == pytest.approx([0.25e-3, 0.5e-3, 0.75e-3, 1.0e-3, 1.0e-3])
    assert logged == pytest.approx(used)  # the logged rate is the one the step used


def test_no_warmup_uses_full_lr(tiny_model):
    learner = _learner(tiny_model, lr=3e-4, warmup_steps=0)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(3e-4)


def test_multiple_epochs_take_several_steps(tiny_model):
    learner = _learner(tiny_model, epochs=3)
    batch = make_batch([2, 3], [2, 2], seed=6)
    batch["advantage"] = torch.tensor([1.0, -1.0])
    metrics = learner.train_step(batch)
    assert learner.version == 3
    # after the first epoch the policy has moved away from the old log-probs
    assert metrics["kl_approx"] > 0.0


def test_state_dict_round_trip(tiny_model):
    batch = make_batch([3, 2, 4], [2, 3, 1], seed=7)
    batch["advantage"] = torch.tensor([1.0, -0.5, -0.5])
    a = _learner(tiny_model, warmup_steps=3)
    a.train_step(batch)
    a.train_step(batch)

    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # checkpoints load this way

    b = _learner(copy.deepcopy(tiny_model), warmup_steps=3)
    b.load_state_dict(state)
    assert b.version == 2 and b.skipped_steps == 0
    assert b.scheduler.last_epoch == a.scheduler.last_epoch == 2
    assert b.optimizer.param_groups[0]["lr"] == a.optimizer.param_groups[0]["lr"]
    # The same next step from the same state gives the same weights.
    a.train_step(batch)
    b.train_step(batch)
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(pb, pa, atol=0, rtol=0, msg=name)


# --------------------------------------------------------------------------- objective settings reach the loss


def test_engine_correction_settings_reach_the_loss(tiny_model):
    # One micro-batch, one epoch: old = own log-probs, so each row's engine weight is exp(shift) =
    # [1.35, 0.82, 1, 2.46, 0.67, 1.11]. token_mask with [0.7, 2] zeroes rows 3 (3 tokens) and 4 (1 token) of 21.
    batch = _accum_batch(tiny_model)
    settings = LossSettings(tis_cap=2.0, engine_correction="token_mask", engine_correction_min=0.7)
    metrics = _learner(tiny_model, loss=settings).train_step(batch)
    assert metrics["engine_masked_fraction"] == pytest.approx(4 / 21)
    assert metrics["tis_fraction"] == pytest.approx(4 / 21)
    # Sorted token weights: 0.67 x1, 0.82 x2, 1 x6, 1.11 x4, 1.35 x5, 2.46 x3; positions 1, 10 and 19 of 0..20.
    assert metrics["engine_weight_p5"] == pytest.approx(math.exp(-0.2), rel=1e-5)
    assert metrics["engine_weight_p50"] == pytest.approx(math.exp(0.1), rel=1e-5)
    assert metrics["engine_weight_p95"] == pytest.approx(math.exp(0.9), rel=1e-5)
    assert metrics["kl_engine"] > 0


def test_loss_type_reaches_the_loss(tiny_model):
    # CISPO at ratio 1 (one epoch): loss = token mean of -A logp (GRPO's would be of -A).
    batch = make_batch([3, 4], [3, 2], seed=7)
    batch["advantage"] = torch.tensor([1.0, -2.0])
    with torch.no_grad():
        logp = sequence_logprobs(tiny_model, batch).logprobs
    expected = float((-(batch["advantage"].unsqueeze(-1) * logp) * batch["response_mask"]).sum() / 5)
    metrics = _learner(tiny_model, loss=LossSettings(loss_type="cispo", tis_cap=None)).train_step(batch)
    assert metrics["loss_policy"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("share_prompt", [False, True])
def test_entropy_bonus_trains_the_model(tiny_model, share_prompt):
    # Zero advantages and no KL: the policy term has no gradient, so every gradient comes from the bonus.
    batch = make_batch([3, 4, 3, 4], [3, 2, 4, 1], seed=8)
    batch["prompt_ids"][1] = batch["prompt_ids"][0]  # two groups of two answers sharing a prompt
    batch["prompt_mask"][1] = batch["prompt_mask"][0]
    batch["prompt_ids"][3] = batch["prompt_ids"][2]
    batch["prompt_mask"][3] = batch["prompt_mask"][2]
    batch["group_id"] = torch.tensor([0, 0, 1, 1])
    grads = {}
    for coef in (0.0, 0.1):
        learner = _learner(
            copy.deepcopy(tiny_model),
            loss=LossSettings(tis_cap=None, entropy_coef=coef),
            share_prompt=share_prompt,
            max_grad_norm=0.0,
        )
        seen = _capture_grads(learner)
        metrics = learner.train_step(batch.clone())
        grads[coef] = sum(float(g.abs().sum()) for g in seen[0].values())
        assert metrics["loss_entropy"] == pytest.approx(-coef * metrics["entropy"], rel=1e-5)
    assert grads[0.0] == 0.0
    assert grads[0.1] > 0.0


@pytest.mark.parametrize(
    ("loss_type", "aggregation", "engine_correction"),
    [
        ("gspo", "seq_mean_token_mean", "sequence_mask"),
        ("gspo_token", "token_mean", "token_mask"),
        ("cispo", "token_mean", "sequence_truncate"),
        ("sapo", "seq_mean_token_mean", "token_band_mask"),
        ("gmpo", "seq_mean_token_mean", "sequence_band_mask"),
    ],
)
def test_accumulated_gradient_equals_full_batch_for_new_objectives(
    tiny_model, loss_type, aggregation, engine_correction
):
    # Sequence ratios, sequence weights and the entropy bonus are all per row, so micro-batching stays exact.
    settings = LossSettings(
        loss_type=loss_type,
        aggregation=aggregation,
        engine_correction=engine_correction,
        engine_correction_min=0.5,
        tis_cap=2.0,
        kl_coef=0.05,
        entropy_coef=0.01,
        engine_correction_max=2.0,
    )  # the band modes' upper bound; the others use tis_cap
    batch = _accum_batch(tiny_model)
    grads, metrics = [], []
    for budget in (10_000, 20):
        learner = _learner(copy.deepcopy(tiny_model), loss=settings, max_grad_norm=0.0, micro_batch_tokens=budget)
        seen = _capture_grads(learner)
        metrics.append(learner.train_step(batch.clone()))
        grads.append(seen[0])
    assert metrics[1]["num_micro_batches"] == 5
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)
    for key in ("loss", "loss_policy", "loss_kl", "loss_entropy"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-5, abs=1e-6), key
    assert metrics[0]["loss_entropy"] < 0 and metrics[0]["tis_fraction"] > 0


@pytest.mark.parametrize("epochs", [1, 2])
def test_learner_logprobs_kept_for_the_sample_logs(tiny_model, epochs):
    # Three micro-batches of 1, 2 and 1 rows, trimmed to their own widths: the kept values are pi_old, in row order.
    batch = make_batch([2, 5, 3, 1], [4, 1, 2, 3], lp=7, lr=6)
    batch["advantage"] = torch.tensor([1.0, -1.0, 0.5, -0.5])
    with torch.no_grad():
        before = sequence_logprobs(tiny_model, batch).logprobs  # [4, 6]
    _learner(tiny_model, micro_batch_tokens=16, epochs=epochs).train_step(batch)
    mask = batch["response_mask"].bool()
    assert batch["learner_logprobs"].shape == (4, 6)
    assert torch.allclose(batch["learner_logprobs"][mask], before[mask], atol=1e-5)
    assert (batch["learner_logprobs"][~mask] == 0).all()
