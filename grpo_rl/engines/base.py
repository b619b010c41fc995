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

**Streaming.** ``generate`` returns when its last answer is done. :meth:`RolloutEngine.stream` hands back each
group as soon as its ``n`` answers are, and draws the next request whenever a group leaves (a group is the unit a
streaming pipeline admits, scores and trains). The in-process vLLM engine drives vLLM's request-level loop, a served
engine sends one HTTP request per group, the simulated engine lets each group take as long as its longest answer,
and the transformers engine, whose ``generate`` call finishes all its rows together, streams call by call
(:func:`stream_by_calls`). A group carries its own seed, the one ``generate`` gives it in a call, so a batch's
groups streamed sample what the batch's ``generate`` samples; :func:`split_groups` and :func:`concat_batches` go
between a batch and its groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Protocol, TypeVar

import torch
from tensordict import NonTensorStack, TensorDict

T = TypeVar("T")


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


@dataclass(frozen=True)
class GroupRequest:
    """One prompt's group of answers to sample, for :meth:`RolloutEngine.stream`."""

    key: int
    """The caller's name for the group (its place in the prompt stream), handed back with its answers."""
    prompt: Sequence[int]
    seed: int | None = None
    """The group's seed: what ``generate`` gives prompt ``i`` of a call seeded ``s``, ``s + i * n``."""


class RolloutEngine(Protocol):
    """What the collector needs from an inference engine."""

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSpec) -> TensorDict:
        """Sample ``n`` answers per tokenised prompt; see the module docstring for the layout."""
        ...

    def stream(
        self, requests: Iterable[GroupRequest], n: int, sampling: SamplingSpec, max_in_flight: int
    ) -> Iterator[tuple[int, TensorDict]]:
        """Sample ``n`` answers for each request, drawing the next request whenever fewer than ``max_in_flight``
        groups are being sampled, and yield ``(key, answers)`` as each group finishes, in whatever order they
        finish (``answers``: ``n`` rows in the module docstring's layout, ``group_id`` 0). Closing the iterator
        abandons the groups in flight. ``sampling.seed`` is not used: each request carries its own.

        ``requests`` may be :class:`Live`: one that has nothing to start now is asked again when a group finishes,
        and the stream ends when it has nothing and no group is in flight."""
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


def _pad(x: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    missing = width - x.shape[1]
    if missing == 0:
        return x
    pad = torch.full((x.shape[0], missing, *x.shape[2:]), value, dtype=x.dtype)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


def concat_batches(batches: list[TensorDict], pad_id: int) -> TensorDict:
    """Rows of ``batches`` (each with its own padding, see :mod:`grpo_rl.engines.base`) as one batch: prompt tensors
    left-padded and answer tensors right-padded to the widest, ``group_id`` renumbered so groups stay distinct."""
    if len(batches) == 1:
        return batches[0]
    out: dict = {}
    offset, group_ids = 0, []
    for b in batches:
        g = b["group_id"]
        group_ids.append(g - (int(g.min()) if g.numel() else 0) + offset)
        offset += int(g.max()) - int(g.min()) + 1 if g.numel() else 0
    out["group_id"] = torch.cat(group_ids)
    for key in batches[0].keys():
        if key == "group_id":
            continue
        values = [b.get(key) for b in batches]
        if isinstance(values[0], torch.Tensor):
            if values[0].dim() >= 2:
                width = max(v.shape[1] for v in values)
                fill = pad_id if key.endswith("_ids") else 0
                values = [_pad(v, width, fill, left=key.startswith("prompt_")) for v in values]
            out[key] = torch.cat(values)
        else:
            out[key] = NonTensorStack(*[x for v in values for x in v.tolist()])
    return TensorDict(out, batch_size=[sum(b.batch_size[0] for b in batches)])


def split_groups(batch: TensorDict) -> list[TensorDict]:
    """The groups of ``batch`` (rows sharing a ``group_id``), in row order, each with ``group_id`` 0 and the batch's
    padding (``concat_batches`` of them is ``batch`` again)."""
    ids = batch["group_id"]
    out = []
    for g in dict.fromkeys(ids.tolist()):
        rows = batch[ids == g]
        rows.set("group_id", torch.zeros_like(rows["group_id"]))
        out.append(rows)
    return out


def stream_by_calls(
    generate: Callable[[Sequence[Sequence[int]], int, SamplingSpec], TensorDict],
    requests: Iterable[GroupRequest],
    n: int,
    sampling: SamplingSpec,
    max_in_flight: int,
) -> Iterator[tuple[int, TensorDict]]:
    """:meth:`RolloutEngine.stream` for an engine that finishes a whole call at once: up to ``max_in_flight``
    requests per ``generate`` call, one call for requests whose seeds follow one another as a call's would (so a
    batch's requests sample exactly what one ``generate`` of the batch samples), and the groups yielded in request
    order when the call returns."""
    check_room(max_in_flight)
    pending = iter(requests)
    while chunk := list(islice(pending, max_in_flight)):
        start = 0
        while start < len(chunk):
            end = start + 1
            while end < len(chunk) and _follows(chunk[end - 1].seed, chunk[end].seed, n):
                end += 1
            call = chunk[start:end]
            batch = generate([r.prompt for r in call], n, replace(sampling, seed=call[0].seed))
            yield from zip((r.key for r in call), split_groups(batch), strict=True)
            start = end


class Live(Iterator[T]):
    """An iterator that may have nothing *now* and more later: ``draw()`` returns the next item, or None for
    "nothing now" (a stream asks again when one of its groups finishes; a generator, once exhausted, is over)."""

    def __init__(self, draw: Callable[[], T | None]):
        self._draw = draw

    def __iter__(self) -> Live[T]:
        return self

    def __next__(self) -> T:
        item = self._draw()
        if item is None:
            raise StopIteration
        return item


def check_room(max_in_flight: int) -> None:
    """:meth:`RolloutEngine.stream`'s bound, checked before anything is drawn."""
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight={max_in_flight} must be at least 1")


def _follows(previous: int | None, seed: int | None, n: int) -> bool:
    """Whether a group seeded ``seed`` can share a call with the group seeded ``previous`` just before it."""
    return seed is None if previous is None else seed == previous + n


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
