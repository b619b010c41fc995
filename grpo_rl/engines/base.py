"""The rollout-engine protocol and the batch layout every engine returns.

An engine turns tokenised prompts into ``n`` sampled answers each, with the log-prob of every sampled
token under the engine's current weights, and accepts new weights from the learner. It is built from config
and knows nothing about the learner.

Batch layout (a ``TensorDict`` with batch size ``[N]``, ``N = len(prompts) * n``; answers of one prompt are
consecutive):

=====================  ==========  ===========================================================
key                    shape       meaning
=====================  ==========  ===========================================================
``prompt_ids``         [N, Lp]     prompt tokens, left-padded with the pad id
``prompt_mask``        [N, Lp]     1 for real prompt tokens
``response_ids``       [N, Lr]     sampled tokens, right-padded with the pad id
``response_mask``      [N, Lr]     1 for sampled tokens
``behavior_logprobs``  [N, Lr]     engine log-prob of each sampled token (0 at padding)
``group_id``           [N]         int64 index of the prompt within the call: the group
``truncated``          [N]         True where the answer hit ``max_new_tokens``
``behavior_version``   [N, Lr]     optional (served engines): the weight version that sampled each token
=====================  ==========  ===========================================================

``group_id`` is the one definition of a group (the answers to one prompt) everywhere downstream: group
advantages (:mod:`grpo_rl.algo.advantages`), the zero-variance filter
(:func:`grpo_rl.algo.advantages.assign_advantages`), the staleness gate (:mod:`grpo_rl.distributed.buffer`),
shared-prompt packing (:mod:`grpo_rl.model.packing`) and data-parallel sharding. No training stage infers groups from
row positions or from equal prompts. Filters keep or drop whole groups, so the groups left are whole and their rows
consecutive, but the ids left need not be ``0 .. P-1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from tensordict import TensorDict


@dataclass(frozen=True)
class SamplingSpec:
    """What to sample: the engine-independent subset of sampling parameters."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """Keep the ``top_k`` most probable tokens (before ``top_p``); 0: off."""
    seed: int | None = None
    """Base seed of this call; prompt ``i`` uses ``seed + i * n`` and its answers the following seeds."""
    stop: tuple[str, ...] = ()
    """Strings that end an answer, kept in it with the tokens that made them (a tool call's closing tag)."""


class RolloutEngine(Protocol):
    """What the collector needs from an inference engine."""

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSpec) -> TensorDict:
        """Sample ``n`` answers per tokenised prompt; see the module docstring for the layout."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Load the learner's weights (HF parameter names) so that the next ``generate`` uses exactly them;
        ``version``: the learner's policy version they are (a served engine stamps its tokens with it)."""
        ...

    def shutdown(self) -> None: ...


def pack_rollouts(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    truncated: Sequence[bool],
    n: int,
    pad_id: int,
    versions: Sequence[Sequence[int]] | None = None,
) -> TensorDict:
    """Pad ragged engine output into the batch layout of the module docstring.

    Args:
        prompts: ``P`` tokenised prompts.
        responses: ``P * n`` sampled token lists, answers of prompt ``i`` at ``i*n .. i*n+n-1``; ``logprobs`` and
            ``versions`` (a served engine's weight version per token, adding ``behavior_version``) alike.
    """
    num = len(responses)
    if num != len(prompts) * n:
        raise ValueError(f"expected {len(prompts) * n} responses for {len(prompts)} prompts x {n}, got {num}")
    lp = max(len(p) for p in prompts)
    lr = max(1, max(len(r) for r in responses))
    prompt_ids = torch.full((num, lp), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((num, lp), dtype=torch.long)
    response_ids = torch.full((num, lr), pad_id, dtype=torch.long)
    response_mask = torch.zeros((num, lr), dtype=torch.long)
    behavior = torch.zeros((num, lr), dtype=torch.float32)
    for j in range(num):
        p = prompts[j // n]
        prompt_ids[j, lp - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        prompt_mask[j, lp - len(p) :] = 1
        r = responses[j]
        if r:
            response_ids[j, : len(r)] = torch.as_tensor(r, dtype=torch.long)
            response_mask[j, : len(r)] = 1
            behavior[j, : len(r)] = torch.as_tensor(logprobs[j], dtype=torch.float32)
    batch = TensorDict(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "behavior_logprobs": behavior,
            "group_id": torch.arange(num) // n,
            "truncated": torch.as_tensor(list(truncated), dtype=torch.bool),
        },
        batch_size=[num],
    )
    if versions is not None:
        behavior_version = torch.zeros((num, lr), dtype=torch.long)
        for j, v in enumerate(versions):
            behavior_version[j, : len(v)] = torch.as_tensor(v, dtype=torch.long)
        batch.set("behavior_version", behavior_version)
    return batch


def split_aliases(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors of ``named`` keyed by name, each storage once, and ``{alias: name}`` for tied ones (first wins)."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple[int, int, tuple], str] = {}
    for name, t in named:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
            unique[name] = t
    return unique, aliases
