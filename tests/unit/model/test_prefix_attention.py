"""Shared-prefix attention (grpo_rl.model.prefix_attention): its three parts against the dense packed mask in fp64,
and packed log-probs and gradients through it equal to the unpacked forward, in fp32 and under bf16 autocast, with
ragged answers, an empty answer, padding, a single-answer group and grouped-query heads."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpo_rl.model.logprobs import packed_attention, sequence_logprobs
from grpo_rl.model.packing import _dense_mask
from grpo_rl.model.prefix_attention import PrefixLayout, shared_prefix_attention
from tests.unit.model.test_packing import GROUPS, grouped_batch

# (prompt lengths, each group's answer lengths): ragged, an empty answer, a row shorter than the longest (padding),
# and a group of one answer.
LAYOUTS = [
    ([5, 3, 7], [[4, 2, 6], [1, 1], [3, 0, 2, 5]]),
    ([6], [[9]]),
    ([2, 9], [[1], [3, 3]]),
]


def _segments(prompt_len: list[int], answer_lens: list[list[int]], s: int) -> torch.Tensor:
    seg = torch.full((len(prompt_len), s), -1)
    for g, (lp, lens) in enumerate(zip(prompt_len, answer_lens, strict=True)):
        seg[g, :lp] = 0
        offset = lp
        for i, n in enumerate(lens):
            seg[g, offset : offset + n] = i + 1
            offset += n
    return seg


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-6), (torch.bfloat16, 3e-2)])
def test_the_parts_equal_the_dense_mask_forward_and_backward(layout, dtype, tol):
    prompt_len, answer_lens = layout
    s = max(lp + sum(lens) for lp, lens in zip(prompt_len, answer_lens, strict=True)) + 2  # two columns of padding
    seg = _segments(prompt_len, answer_lens, s)
    real = (seg >= 0)[:, None, :, None]
    gen = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(len(prompt_len), 3, s, 16, dtype=torch.float64, generator=gen) for _ in range(4))
    w = w * real  # the loss reads real tokens only

    def run(fn, cast):
        leaves = [t.to(cast).requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        (out.double() * w).sum().backward()
        return [out.detach().double() * real] + [t.grad.double() for t in leaves]

    mask = _dense_mask(seg)  # the packed mask the dense path gives sdpa (test_packing.py checks it by hand)
    want = run(lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c, attn_mask=mask), dtype)
    lay = PrefixLayout.build(prompt_len, answer_lens, s, torch.device("cpu"))
    got = run(lambda a, b, c: shared_prefix_attention(a, b, c, lay, 16**-0.5), dtype)
    for name, g, x in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert torch.isfinite(g).all(), name
        rel = ((g - x).abs().max() / x.abs().max()).item()
        assert rel < tol, (name, rel)


def _gqa_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as SmolLM2's 9 heads over 3
        max_position_embeddings=256,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).float()


# The groups of the packing tests (ragged, an empty answer, prompts of two lengths) and a group of one answer.
BATCHES = {"ragged": GROUPS, "one answer": [([7, 8, 9, 10], [[31, 32, 33, 34, 35, 36]])]}


@pytest.mark.parametrize("groups", list(BATCHES.values()), ids=list(BATCHES))
@pytest.mark.parametrize("model_kind", ["tiny", "gqa"])
def test_packed_logprobs_and_gradients_through_the_parts_equal_unpacked(tiny_model, groups, model_kind):
    model = tiny_model if model_kind == "tiny" else _gqa_model()
    batch = grouped_batch(groups)
    weights = torch.randn(batch["response_ids"].shape, generator=torch.Generator().manual_seed(1))
    assert packed_attention(model, "auto", torch.device("cpu")) == "prefix"

    def run(**kw):
        model.zero_grad(set_to_none=True)
        out = sequence_logprobs(model, batch, with_entropy=True, **kw)
        (out.logprobs * weights).sum().backward()
        return out, [p.grad.clone() for p in model.parameters()]

    want, want_grads = run()
    got, got_grads = run(share_prompt=True, attention="prefix")
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.entropy, want.entropy, atol=1e-5, rtol=1e-5)
    assert (got.logprobs[batch["response_mask"] == 0] == 0).all()
    for g_got, g_want in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-4)


def test_under_bf16_autocast_the_parts_agree_with_the_dense_mask(tiny_model):
    batch = grouped_batch(GROUPS)
    weights = torch.randn(batch["response_ids"].shape, generator=torch.Generator().manual_seed(2))

    def run(model, attention):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = sequence_logprobs(model, batch, share_prompt=True, attention=attention)
        (out.logprobs * weights).sum().backward()
        return out.logprobs.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    dense_lp, dense_grad = run(copy.deepcopy(tiny_model), "dense")
    prefix_lp, prefix_grad = run(copy.deepcopy(tiny_model), "prefix")
    assert prefix_lp.dtype == torch.float32 and torch.isfinite(prefix_grad).all()
    # bf16 keeps 8 bits of mantissa: the two kernels sum in different orders, so relative 2e-2
    assert ((prefix_lp - dense_lp).norm() / dense_lp.norm()).item() < 2e-2
    assert ((prefix_grad - dense_grad).norm() / dense_grad.norm()).item() < 2e-2


def test_auto_takes_the_dense_mask_where_the_parts_do_not_run(tiny_model):
    assert packed_attention(tiny_model, "dense", torch.device("cpu")) == "dense"
    assert packed_attention(tiny_model, "auto", torch.device("cuda")) == "dense"
    tiny_model.gradient_checkpointing_enable()  # its recomputation runs outside the forward's switch
    assert packed_attention(tiny_model, "auto", torch.device("cpu")) == "dense"
    tiny_model.gradient_checkpointing_disable()
    assert packed_attention(tiny_model, "auto", torch.device("cpu")) == "prefix"
    tiny_model.config._attn_implementation = "eager"
    assert packed_attention(tiny_model, "auto", torch.device("cpu")) == "dense"
    with pytest.raises(ValueError, match="train.packed_attention=prefix needs"):
        packed_attention(tiny_model, "prefix", torch.device("cpu"))
    with pytest.raises(ValueError, match="choose one of auto, prefix, dense"):
        packed_attention(tiny_model, "flash", torch.device("cpu"))


def test_the_switch_is_counted_and_restored(tiny_model):
    from grpo_rl.model.prefix_attention import NAME, prefix_attention_for

    with prefix_attention_for(tiny_model):
        with prefix_attention_for(tiny_model):  # a second thread's packed forward of the same model
            assert tiny_model.config._attn_implementation == NAME
        assert tiny_model.config._attn_implementation == NAME  # the first is still inside
        with pytest.raises(ValueError, match="needs the packed rows' layout"):
            tiny_model(input_ids=torch.tensor([[1, 2, 3]]))  # an unpacked forward meanwhile fails, never attends wrong
    assert tiny_model.config._attn_implementation == "sdpa"


def test_a_checkpointed_learner_trains_through_the_dense_mask(tiny_model):
    """Gradient checkpointing (the lowmem preset) recomputes layers in the backward: auto keeps the dense mask."""
    from grpo_rl.training.learner import Learner, LossSettings
    from tests.unit.training.test_learner import _accum_batch

    learner = Learner(
        tiny_model, torch.device("cpu"), LossSettings(), lr=1e-3, gradient_checkpointing=True, share_prompt=True
    )
    batch = _accum_batch(tiny_model)
    batch["group_id"] = torch.arange(batch.batch_size[0])  # groups of one answer
    metrics = learner.train_step(batch)
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0
