"""Stand-ins for the parts a rollout source streams groups through: an environment whose state counts its resets,
and a collector whose engine finishes each group with rewards the test chooses, the way the engines' streams
draw their requests (``islice`` of what fits, asked again when a group finishes)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice

import torch
from tensordict import NonTensorStack, TensorDict

from grpo_rl.rollout.collector import CollectStats

G = 2  # answers per group


class CountingEnv:
    """``P`` prompts per reset; its state is how many resets it had (prompt ``i`` of reset ``r`` is ``r * P + i``)."""

    def __init__(self, prompts_per_step: int = 2):
        self.prompts_per_step = prompts_per_step
        self.resets = 0

    def reset(self) -> TensorDict:
        p, first = self.prompts_per_step, self.resets * self.prompts_per_step
        self.resets += 1
        return TensorDict(
            {
                "prompt_tokens": NonTensorStack(*[[first + i] for i in range(p)]),
                "prompt_index": torch.arange(first, first + p),
            },
            batch_size=[p],
        )

    def state_dict(self) -> dict:
        return {"resets": self.resets}

    def load_state_dict(self, state: dict) -> None:
        self.resets = state["resets"]


def make_group(g: int, rewards: list[float], *, version: int = 0, answer_len: int = 2, per_batch: int = 2):
    """Group ``g`` of the stream: ``len(rewards)`` answers of ``answer_len`` tokens (their last one padding)."""
    n = len(rewards)
    mask = torch.ones(n, answer_len, dtype=torch.long)
    mask[:, -1] = 0
    return TensorDict(
        {
            "prompt_ids": torch.full((n, 2), 11),
            "prompt_mask": torch.ones(n, 2, dtype=torch.long),
            "response_ids": 7 * mask,
            "response_mask": mask,
            "behavior_logprobs": -mask.float(),
            "group_id": torch.zeros(n, dtype=torch.long),
            "truncated": torch.zeros(n, dtype=torch.bool),
            "reward": torch.tensor(rewards, dtype=torch.float32),
            "policy_version": torch.full((n,), version),
            "group_index": torch.full((n,), g),
            "batch_index": torch.full((n,), g // per_batch),
            "response_text": NonTensorStack(*[f"g{g}a{i}" for i in range(n)]),
        },
        batch_size=[n],
    )


class StreamingCollector:
    """Streams group ``g`` with ``rewards(g)``; records the prompts drawn and the most groups ever in flight.

    Args:
        order: reorders each round of drawn groups before they finish (default: as drawn).
        fail: how many streams fail (raise) after their first group, as a lost engine server does.
    """

    def __init__(
        self,
        rewards: Callable[[int], list[float]] = lambda g: [0.0, 1.0],
        *,
        prompts_per_step: int = 2,
        order: Callable[[list], list] = lambda drawn: drawn,
        fail: int = 0,
        error: Exception | None = None,
    ):
        self.env = CountingEnv(prompts_per_step)
        self.tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()
        self.rewards, self.order, self.fail, self.error = rewards, order, fail, error
        self.drawn: list[int] = []
        self.prompts: list[int] = []
        self.most_in_flight = 0

    def stream(self, groups, prompts, version, max_in_flight):
        pending, in_flight = iter(groups), []
        while True:
            for g in islice(pending, max_in_flight - len(in_flight)):
                self.drawn.append(g)
                self.prompts.append(prompts.row(g)["prompt_tokens"][0][0])
                in_flight.append((g, version()))
            self.most_in_flight = max(self.most_in_flight, len(in_flight))
            if not in_flight:
                return
            in_flight = self.order(in_flight)
            g, drawn_at = in_flight.pop(0)
            group = make_group(g, self.rewards(g), version=drawn_at, per_batch=self.env.prompts_per_step)
            yield g, group, CollectStats(generation_seconds=1.0, num_tokens=2, failure_examples=[{"group": g}])
            if self.fail:
                self.fail -= 1
                raise self.error
