"""The scale simulation's engine: sleeps for a batch's generation time and answers with random tokens
(:mod:`grpo_rl.training.simulated` has the whole story)."""
from __future__ import annotations

import random
import time
from typing import Iterable, Sequence
import torch
from tensordict import TensorDict
from grpo_rl.engines.base import SamplingSpec, pack_rollouts



def _sleep(seconds: float, jitter: float, rng: random.Random) -> float:
    took = max(0.0, seconds * (1.0 + jitter * rng.gauss(0.0, 1.0)))
    time.sleep(took)
    return took


class SimulatedEngine:
    """Sleeps ``seconds`` per batch, then answers every prompt with ``n`` random token sequences.

    Args:
        vocab_size: token ids are drawn below it.
        seconds, jitter: the generation time of one batch and its relative spread.
        answer_tokens: tokens per answer (at most the call's ``max_new_tokens``).
        pad_id: the tokenizer's pad id.
    """

    def __init__(self, *, vocab_size: int, seconds: float, jitter: float, answer_tokens: int, pad_id: int):
        self.vocab_size, self.seconds, self.jitter = vocab_size, seconds, jitter
        self.answer_tokens, self.pad_id = answer_tokens, pad_id
        self.rng = random.Random()  # fresh per process: replicas must not draw the same times

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSpec) -> TensorDict:
        _sleep(self.seconds, self.jitter, self.rng)
        g = torch.Generator().manual_seed(sampling.seed or 0)
        length = min(self.answer_tokens, sampling.max_new_tokens)
        responses = [torch.randint(0, self.vocab_size, (length,), generator=g).tolist() for _ in range(len(prompts) * n)]
        logprobs = [[-1.0] * length for _ in responses]
        return pack_rollouts(prompts, responses, logprobs, [False] * len(responses), n, self.pad_id)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        for _ in named_tensors:  # the weights arrive (the transport is real); nothing is loaded
            pass

    def shutdown(self) -> None:
        """Nothing to release."""
