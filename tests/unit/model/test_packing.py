"""Shared-prompt packing (grpo_rl.model.packing): the layout by hand, and log-probs/gradients equal to the unpacked
forward."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from grpo_rl.model.logprobs import sequence_logprobs
from grpo_rl.model.packing import group_micro_batches, group_spans, pack_groups
from grpo_rl.training.reference import RefScorer

PAD = 0


def grouped_batch(groups: list[tuple[list[int], list[list[int]]]]) -> TensorDict:
    """Rows ``(prompt, answer)`` for every answer of every group, prompts left- and answers right-padded;
    ``group_id`` is the group's index."""
    rows = [(p, a) for p, answers in groups for a in answers]
    lp, lr = max(len(p) for p, _ in rows), max(1, max(len(a) for _, a in rows))
    n = len(rows)
    out = {
        k: torch.full((n, w), PAD, dtype=torch.long)
        for k, w in (("prompt_ids", lp), ("prompt_mask", lp), ("response_ids", lr), ("response_mask", lr))
    }
    for i, (p, a) in enumerate(rows):
        out["prompt_ids"][i, lp - len(p) :] = torch.tensor(p)
        out["prompt_mask"][i, lp - len(p) :] = 1
        if a:
            out["response_ids"][i, : len(a)] = torch.tensor(a)
            out["response_mask"][i, : len(a)] = 1
    out["group_id"] = torch.tensor([g for g, (_, answers) in enumerate(groups) for _ in answers])
    return TensorDict(out, batch_size=[n])


# Two groups, ragged answers (one empty), prompts of different lengths; token ids are arbitrary vocabulary ids.
GROUPS = [
    ([11, 12, 13, 14, 15], [[101, 102, 103], [104], [105, 106, 107, 108, 109]]),
    ([21, 22], [[201, 202], [], [203, 204, 205, 206]]),
]


def test_layout_by_hand():
    batch = grouped_batch([([7, 8], [[1, 2], [3]])])
    packed = pack_groups(batch)
    assert packed.input_ids.tolist() == [[7, 8, 1, 2, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    # Rows are queries, columns keys: the prompt is causal, each answer sees the prompt and its own past only.
    want = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],
    ]
    assert packed.attention_mask[0, 0].int().tolist() == want
    # Answer 1: token 1 predicted at position 1 (last prompt token), token 2 at 2; answer 2: token 3 at 1.
    assert packed.source_index.tolist() == [1, 2, 1]
    assert list(zip(packed.target_row.tolist(), packed.target_col.tolist(), strict=True)) == [(0, 0), (0, 1), (1, 0)]
    assert packed.target_ids.tolist() == [1, 2, 3]


def test_padding_rows_attend_to_themselves_only():
    packed = pack_groups(grouped_batch([([7, 8, 9], [[1, 2]]), ([5], [[3]])]))
    assert packed.input_ids.shape == (2, 5)
    mask = packed.attention_mask[1, 0]  # row of length 2 padded to 5
    assert mask[2:].int().tolist() == [[0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
    assert not mask[:2, 2:].any()  # real tokens never see padding


def test_group_spans_and_micro_batches():
    batch = grouped_batch(GROUPS)
    assert group_spans(batch["group_id"]) == [(0, 3), (3, 6)]
    # packed lengths: 5 + 9 = 14 and 2 + 6 = 8; together 2 x 14 = 28 tokens
    assert [mb.batch_size[0] for mb in group_micro_batches(batch, 28)] == [6]
    assert [mb.batch_size[0] for mb in group_micro_batches(batch, 27)] == [3, 3]
    assert [mb.batch_size[0] for mb in group_micro_batches(batch, 1)] == [3, 3]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logprobs_equal_unpacked(tiny_model, temperature):
    tiny_model.eval()
    batch = grouped_batch(GROUPS)
    with torch.no_grad():
        want = sequence_logprobs(tiny_model, batch, temperature=temperature, with_entropy=True)
        got = sequence_logprobs(tiny_model, batch, temperature=temperature, with_entropy=True, share_prompt=True)
    assert got.logprobs.shape == want.logprobs.shape == batch["response_ids"].shape
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.entropy, want.entropy, atol=1e-5, rtol=1e-5)
    assert (got.logprobs[batch["response_mask"] == 0] == 0).all()
    assert (got.logprobs[batch["response_mask"] == 1] < 0).all()


def test_packed_gradients_equal_unpacked(tiny_model):
    batch = grouped_batch(GROUPS)
    weights = torch.randn(batch["response_ids"].shape, generator=torch.Generator().manual_seed(0))

    def grads(share_prompt: bool) -> list[torch.Tensor]:
        tiny_model.zero_grad(set_to_none=True)
        out = sequence_logprobs(tiny_model, batch, share_prompt=share_prompt)
        (out.logprobs * weights).sum().backward()
        return [p.grad.clone() for p in tiny_model.parameters()]

    want, got = grads(False), grads(True)
    assert any(g.abs().sum() > 0 for g in want)
    for g_want, g_got in zip(want, got, strict=True):
        torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-4)


def test_eager_attention_takes_the_additive_mask(tiny_model):
    tiny_model.eval()
    batch = grouped_batch(GROUPS)
    with torch.no_grad():
        want = sequence_logprobs(tiny_model, batch).logprobs
        tiny_model.config._attn_implementation = "eager"
        got = sequence_logprobs(tiny_model, batch, share_prompt=True).logprobs
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_packing_shrinks_the_work():
    batch = grouped_batch(GROUPS)
    unpacked = batch.batch_size[0] * (batch["prompt_ids"].shape[1] + batch["response_ids"].shape[1])  # 6 x 10
    assert pack_groups(batch).num_tokens == 2 * 14 < unpacked


# --------------------------------------------------------------------------- groups come from group_id


def test_two_groups_with_the_same_prompt_stay_two_rows():
    batch = grouped_batch([([7, 8], [[1, 2]]), ([7, 8], [[3]])])
    assert group_spans(batch["group_id"]) == [(0, 1), (1, 2)]
    packed = pack_groups(batch)
    assert packed.input_ids.tolist() == [[7, 8, 1, 2], [7, 8, 3, 0]]
    assert packed.source_index.tolist() == [1, 2, 5]  # row 2's answer is predicted in packed row 1 (offset 4)
    # packed lengths 4 and 3: one micro-batch costs 2 x 4 = 8 tokens, so a budget of 7 splits the groups
    assert [mb.batch_size[0] for mb in group_micro_batches(batch, 8)] == [2]
    assert [mb.batch_size[0] for mb in group_micro_batches(batch, 7)] == [1, 1]


def test_spans_are_runs_of_group_id():
    assert group_spans(torch.tensor([4, 4, 9, 9, 9, 4, 2])) == [(0, 2), (2, 5), (5, 6), (6, 7)]
    assert group_spans(torch.zeros(0, dtype=torch.long)) == []


def test_group_split_over_runs_packs_each_run_with_equal_logprobs(tiny_model):
    tiny_model.eval()
    # Group 0's rows are 0 and 2, group 1's row is 1: three packed rows, each with its own copy of the prompt.
    batch = grouped_batch(GROUPS)[torch.tensor([0, 3, 1])]
    assert batch["group_id"].tolist() == [0, 1, 0]
    packed = pack_groups(batch)
    assert packed.input_ids.shape[0] == 3
    with torch.no_grad():
        want = sequence_logprobs(tiny_model, batch).logprobs
        got = sequence_logprobs(tiny_model, batch, share_prompt=True).logprobs
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rows_of_a_group_must_share_the_prompt():
    batch = grouped_batch([([7, 8], [[1]]), ([5, 6], [[2]])])
    batch["group_id"] = torch.tensor([0, 0])
    with pytest.raises(ValueError, match="row 1 has the group_id of row 0"):
        pack_groups(batch)
    shorter = grouped_batch([([7, 8], [[1]]), ([8], [[2]])])  # same last token, different length
    shorter["group_id"] = torch.tensor([3, 3])
    with pytest.raises(ValueError, match="different prompt"):
        pack_groups(shorter)


def test_ref_scorer_packs_by_group_id(tiny_model):
    tiny_model.eval()
    batch = grouped_batch(GROUPS)
    scores = [
        RefScorer(tiny_model, torch.device("cpu"), micro_batch_tokens=16, share_prompt=share).score(batch.clone())[
            "ref_logprobs"
        ]
        for share in (False, True)
    ]
    torch.testing.assert_close(scores[1], scores[0], atol=1e-5, rtol=1e-5)
