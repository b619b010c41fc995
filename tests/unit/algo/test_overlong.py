"""Tests for DAPO's length treatments (grpo_rl.algo.overlong): the soft overlong punishment, overlong filtering in the
advantage stage, its wiring from the config, and the loss the learner then trains on, with hand-computed values."""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from grpo_rl.algo.advantages import assign_advantages
from grpo_rl.algo.loss import grpo_loss
from grpo_rl.algo.overlong import overlong_reward
from grpo_rl.config.schema import GRPOConfig
from grpo_rl.model.logprobs import sequence_logprobs
from grpo_rl.training.learner import Learner, LossSettings
from grpo_rl.training.step import score_batch

CPU = torch.device("cpu")

# --------------------------------------------------------------------------- overlong_reward


def test_soft_punishment_is_dapos_piecewise_function():
    # L_max = 10, L_cache = 4: free up to 6 tokens, then -1/4 per token, -1 at 10 and beyond.
    lengths = torch.tensor([3, 6, 7, 9, 10, 12])
    out = overlong_reward(lengths, max_tokens=10, buffer=4)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.75, -1.0, -1.0]))
    half = overlong_reward(lengths, max_tokens=10, buffer=4, penalty=0.5)
    torch.testing.assert_close(half, torch.tensor([0.0, 0.0, -0.125, -0.375, -0.5, -0.5]))


def test_buffer_zero_is_off_and_a_buffer_past_the_limit_is_refused():
    torch.testing.assert_close(overlong_reward(torch.tensor([1, 10, 50]), max_tokens=10, buffer=0), torch.zeros(3))
    for buffer in (-1, 10, 11):
        with pytest.raises(ValueError, match="buffer"):
            overlong_reward(torch.tensor([1]), max_tokens=10, buffer=buffer)


# --------------------------------------------------------------------------- assign_advantages


def _batch(rewards: list[float], group_id: list[int], lengths: list[int], truncated: list[bool]) -> TensorDict:
    n, width = len(rewards), max(lengths)
    response_mask = (torch.arange(width) < torch.tensor(lengths).unsqueeze(-1)).long()  # [N, L]
    return TensorDict(
        {
            "reward": torch.tensor(rewards),
            "group_id": torch.tensor(group_id),
            "response_mask": response_mask,
            "truncated": torch.tensor(truncated),
            "row": torch.arange(n),
        },
        batch_size=[n],
    )


def test_shaping_enters_the_advantages_and_reward_stays_the_task_reward():
    # Equal task rewards: without shaping the group has no signal. L_max = 10, L_cache = 4: lengths 5 and 9
    # get 0 and -0.75, so the shaped rewards are [1, 0.25], mean 0.625, advantages (unscaled) +-0.375.
    batch = _batch([1.0, 1.0], [0, 0], [5, 9], [False, False])
    out, stats = assign_advantages(batch, scale_by_std=False, overlong_buffer=4, max_tokens=10)
    torch.testing.assert_close(out["advantage"], torch.tensor([0.375, -0.375]))
    torch.testing.assert_close(out["reward"], torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(out["reward_overlong"], torch.tensor([0.0, -0.75]))
    assert stats["reward_overlong_mean"] == pytest.approx(-0.375)
    assert out["zero_variance"].tolist() == [False, False]  # the filter sees the shaped reward


def test_shaping_off_by_default_changes_nothing():
    out, stats = assign_advantages(_batch([1.0, 1.0], [0, 0], [5, 9], [False, True]), scale_by_std=False)
    torch.testing.assert_close(out["advantage"], torch.zeros(2))
    assert "reward_overlong" not in out.keys()
    assert "reward_overlong_mean" not in stats and "overlong_filtered" not in stats
    assert out.batch_size[0] == 2  # truncated answers stay without the filter


def test_shaping_needs_the_limit():
    with pytest.raises(ValueError, match="max_tokens"):
        assign_advantages(_batch([1.0, 0.0], [0, 0], [5, 9], [False, False]), overlong_buffer=4)


def test_filter_drops_truncated_answers_after_they_count_in_the_advantages():
    # Group 0 [1, 0, 0], the last truncated: mean 1/3, so the kept answers get 2/3 and -1/3 (over the two kept
    # answers alone it would be +-1/2). Group 1 [1, 1] has no signal and is dropped whole by the zero-variance
    # filter first, so its truncated answer is not counted again. Group 2 [0, 1]: the truncated 0 counts in the
    # mean 1/2 and is dropped, leaving +1/2.
    batch = _batch(
        [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0],
        [0, 0, 0, 1, 1, 2, 2],
        [3, 4, 8, 8, 2, 8, 5],
        [False, False, True, True, False, True, False],
    )
    out, stats = assign_advantages(batch, scale_by_std=False, filter_zero_variance=True, filter_overlong=True)
    assert out["row"].tolist() == [0, 1, 6]
    torch.testing.assert_close(out["advantage"], torch.tensor([2 / 3, -1 / 3, 0.5]))
    assert stats["overlong_filtered"] == 2.0
    assert stats["zero_variance_groups"] == 1.0


def test_score_batch_passes_the_policy_settings():
    cfg = OmegaConf.structured(GRPOConfig)
    cfg.sampling.max_new_tokens = 10
    cfg.policy.update(overlong_buffer=4, overlong_penalty=2.0, overlong_filter=True, scale_advantages_by_std=False)
    # Shaping [0, -1.5, -2] (penalty 2): shaped rewards [1, -0.5, -1], mean -1/6; the truncated third is dropped.
    batch = _batch([1.0, 1.0, 1.0], [0, 0, 0], [5, 9, 10], [False, False, True])
    out, stats = score_batch(batch, None, cfg.policy, cfg.sampling.max_new_tokens)
    torch.testing.assert_close(out["advantage"], torch.tensor([7 / 6, -1 / 3]))
    assert stats["reward_overlong_mean"] == pytest.approx(-3.5 / 3)
    assert stats["overlong_filtered"] == 1.0


# --------------------------------------------------------------------------- what the learner trains on


def _learner_batch(model) -> TensorDict:
    """Six answers of different lengths, the 2nd and 5th truncated; behaviour log-probs near the model's own."""
    g = torch.Generator().manual_seed(3)
    prompt_lens, response_lens = [3, 7, 5, 2, 6, 4], [5, 7, 2, 3, 7, 4]
    n, lp, lr = 6, 7, 7
    prompt_mask = (torch.arange(lp) >= lp - torch.tensor(prompt_lens).unsqueeze(-1)).long()  # [N, Lp] left-padded
    response_mask = (torch.arange(lr) < torch.tensor(response_lens).unsqueeze(-1)).long()  # [N, Lr]
    batch = TensorDict(
        {
            "prompt_ids": torch.randint(1, 1000, (n, lp), generator=g) * prompt_mask,
            "prompt_mask": prompt_mask,
            "response_ids": torch.randint(1, 1000, (n, lr), generator=g) * response_mask,
            "response_mask": response_mask,
            "advantage": torch.tensor([1.0, -0.5, 0.8, -1.2, 0.3, 0.6]),
            "truncated": torch.tensor([False, True, False, False, True, False]),
        },
        batch_size=[n],
    )
    with torch.no_grad():
        own = sequence_logprobs(model, batch).logprobs  # [N, Lr]
    batch["behavior_logprobs"] = (own - 0.1 * torch.rand(n, lr, generator=g)) * response_mask
    return batch


@pytest.mark.parametrize(("aggregation", "rows_scale"), [("token_mean", 1.0), ("seq_mean_token_mean", 6 / 4)])
def test_filtered_batch_trains_like_dapos_masked_loss(tiny_model, aggregation, rows_scale):
    """Training on the kept answers is DAPO's (and TRL's) loss with the truncated answers' mask zeroed: under
    token_mean both divide by the kept answers' tokens. Under seq_mean_token_mean a masked row would still count
    in the mean over 6 answers; here the mean is over the 4 kept, a factor 6/4."""
    full = _learner_batch(tiny_model)
    keep = ~full["truncated"]
    # Reference: one pass over all six rows, the truncated rows' tokens masked out of the loss.
    ref_model = copy.deepcopy(tiny_model)
    out = sequence_logprobs(ref_model, full)
    loss_mask = full["response_mask"] * keep.unsqueeze(-1)  # [N, Lr]
    grpo_loss(
        out.logprobs,
        out.logprobs.detach(),
        full["advantage"],
        loss_mask,
        behavior_logprobs=full["behavior_logprobs"],
        settings=LossSettings(aggregation=aggregation),
    ).loss.backward()
    expected = {name: p.grad * rows_scale for name, p in ref_model.named_parameters() if p.grad is not None}
    # The learner on the filtered batch, cut into several micro-batches (each weighted by its share).
    learner = Learner(
        copy.deepcopy(tiny_model),
        CPU,
        LossSettings(aggregation=aggregation),
        lr=1e-3,
        max_grad_norm=0.0,
        micro_batch_tokens=24,
    )
    seen = []
    learner.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(
            {name: p.grad.clone() for name, p in learner.model.named_parameters() if p.grad is not None}
        )
    )
    metrics = learner.train_step(full[keep])
    assert metrics["num_micro_batches"] > 1
    assert seen[0].keys() == expected.keys() and expected
    for name, grad in expected.items():
        torch.testing.assert_close(seen[0][name], grad, atol=1e-5, rtol=1e-4, msg=name)
