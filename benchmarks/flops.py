"""The floating-point work a GRPO step really needs, and the matmul rate this machine reaches.

Work is counted over distinct tokens only (a group's prompt once, as prefix caching and shared-prompt packing
run it), in multiply-add pairs x 2, for a Llama-style decoder with ``config.json`` dimensions:

* per token through the decoder: ``2 * linear_params`` (q, k, v, o and the gated MLP of every layer);
* per scored position through the LM head: ``2 * d * V`` (only answer tokens, and one per prompt in generation);
* per (query, visible key) pair: ``4 * d`` per layer (``q.k`` and ``p.v``), with the pairs an answer token
  really sees (its prompt and its own past), not a dense square.

Generation: the prompt's prefill once per group plus one decoder pass per sampled token after the first.
Reference: one forward over the group's distinct tokens. Policy: forward + backward = 3 x the forward.
The embedding lookup, norms, activations, softmax and the optimizer are not matmuls and are not counted, so
the bound is a little optimistic, which is what a lower bound should be.
"""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class StepFlops:
    generation: float
    reference: float
    training: float
    tokens: float  # distinct tokens through one reference / policy pass

    @staticmethod
    def mean(items: list["StepFlops"]) -> "StepFlops":
        n = max(1, len(items))
        return StepFlops(*(sum(getattr(i, k) for i in items) / n for k in ("generation", "reference", "training", "tokens")))


def _dims(cfg: dict) -> tuple[int, int, int, int, int]:
    d, layers, ff, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    head_dim = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim
    linear = layers * (d * d + 2 * d * kv + d * d + 3 * d * ff)
    return d, layers, linear, vocab, ff


def step_flops(cfg: dict, groups: list[list[int]]) -> StepFlops:
    """FLOPs of one step; ``groups`` is ``[[prompt_len, answer_len, ...], ...]``."""
    d, layers, linear, vocab, _ = _dims(cfg)
    per_token, per_head, per_pair = 2 * linear, 2 * d * vocab, 4 * d * layers
    gen = fwd = tokens = 0.0
    for p, *answers in groups:
        prompt_pairs = p * (p + 1) / 2
        gen += p * per_token + prompt_pairs * per_pair + per_head
        n = sum(answers)
        answer_pairs = sum(a * p + a * (a + 1) / 2 for a in answers)
        # decoding: every sampled token after the first is fed back once (the last one needs no pass)
        fed = sum(max(0, a - 1) for a in answers)
        gen += fed * (per_token + per_head) + sum(sum(p + t + 1 for t in range(max(0, a - 1))) for a in answers) * per_pair
        fwd += (p + n) * per_token + (prompt_pairs + answer_pairs) * per_pair + n * per_head
        tokens += p + n
    return StepFlops(generation=gen, reference=fwd, training=3 * fwd, tokens=tokens)


def matmul_rates(cfg: dict, threads: int, tokens: int = 512, repeats: int = 5) -> dict:
    """Best-of-``repeats`` FLOP/s of the model's own matmul shapes at ``tokens`` rows, fp32 and bf16."""
    import torch

    d, _, _, vocab, ff = _dims(cfg)
    shapes = [(tokens, d, ff), (tokens, ff, d), (tokens, d, d), (tokens, d, vocab)]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    rates = {"threads": threads}
    try:
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            pairs = [(torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)) for m, k, n in shapes]
            work = sum(2 * m * k * n for m, k, n in shapes)
            for a, b in pairs:
                a @ b
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                for a, b in pairs:
                    a @ b
                best = min(best, time.perf_counter() - t)
            rates[name] = work / best
    finally:
        torch.set_num_threads(old)
    return rates
