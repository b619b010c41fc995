"""Shared-prompt packing: score a group's prompt once instead of ``G`` times.

GRPO samples ``G`` answers to each prompt, and the unpacked forward (:func:`grpo_rl.model.logprobs.sequence_logprobs`)
runs ``[prompt | answer_i]`` for every answer, so the prompt goes through the model ``G`` times. Here each group
becomes one row ``[prompt | answer_1 | ... | answer_G]`` with an attention mask that lets every answer token
see the prompt and the earlier tokens of its own answer, and nothing else, and with position ids that restart
at ``len(prompt)`` for every answer. Each answer token therefore sees exactly the keys, values and positions it
sees unpacked, so its log-prob is the same up to floating-point summation order (checked to 1e-5 in fp32 by
``tests/unit/model/test_packing.py``, gradients included). This is the "shared-prefix" or tree-attention trick of
packed RL trainers; the saving is ``(G - 1) * len(prompt)`` tokens per group in every reference and policy pass.

What this module does: find the groups, lay them out, build the mask, and say where each answer token's
predicting hidden state lands. The model forward itself is in :mod:`grpo_rl.model.logprobs`. A group is the rows that
share a ``group_id`` (the one definition, see :mod:`grpo_rl.engines.base`); a packed row is a run of consecutive
rows with the same ``group_id``, which is a whole group in every batch an engine returns (its answers are
consecutive) and after any filter that keeps or drops whole groups. The rows of a group must share the prompt
(checked).

Departures and limits:

* The mask is a dense boolean ``[R, 1, S, S]`` tensor (``R`` groups, ``S`` the longest packed row), which the
  ``sdpa`` and ``eager`` attention implementations of transformers accept as given. FlashAttention-2's varlen
  interface cannot express "prompt shared by several answers", so it is not supported.
* A dense mask makes attention cost ``S^2`` per row where ``G`` separate rows cost ``G * (Lp + Lr)^2``; for
  GRPO's shapes (``Lp`` a few hundred, ``G <= 16``) attention stays small next to the linear layers, which this
  packing cuts by up to ``G`` times on the prompt.
* A group whose rows are not consecutive is packed as one row per run; the log-probs are unchanged, only the
  saving shrinks. Two groups with the same prompt stay two rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict


@dataclass
class PackedGroups:
    """A batch of ``B`` (prompt, answer) rows laid out as ``R`` packed group rows of length ``S``; ``T`` is the
    number of real answer tokens in the batch."""

    input_ids: torch.Tensor  # [R, S] prompt, then every answer of the group, then padding
    position_ids: torch.Tensor  # [R, S] 0..Lp-1 on the prompt, Lp.. again on every answer
    attention_mask: torch.Tensor | None  # [R, 1, S, S] bool, True where the query (dim 2) may attend the key (dim 3)
    source_index: torch.Tensor  # [T] index into the flattened [R * S] hidden states predicting each answer token
    target_row: torch.Tensor  # [T] row of the answer token in the unpacked [B, Lr] layout
    target_col: torch.Tensor  # [T] its column
    target_ids: torch.Tensor  # [T] the answer token itself
    prompt_len: list[int]  # [R] each group's prompt length
    answer_lens: list[list[int]]  # [R][G_r] each group's answer lengths, in row order

    @property
    def num_tokens(self) -> int:
        """Padded tokens through the model: ``R * S``."""
        return self.input_ids.numel()


def group_spans(group_id: torch.Tensor) -> list[tuple[int, int]]:
    """``[(start, end), ...]``: maximal runs of consecutive rows with the same ``group_id`` ``[B]``."""
    b = group_id.shape[0]
    if b == 0:
        return []
    starts = [0] + [i + 1 for i in torch.nonzero(group_id[1:] != group_id[:-1]).flatten().tolist()]
    return list(zip(starts, starts[1:] + [b], strict=True))


def _check_shared_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, spans: list[tuple[int, int]]) -> None:
    """Raise unless every row of a span has the prompt of the span's first row (``[B, Lp]``, left-padded)."""
    device = prompt_ids.device
    sizes = torch.tensor([end - start for start, end in spans], device=device)
    first = torch.tensor([start for start, _ in spans], device=device).repeat_interleave(sizes)  # [B]
    same_mask = (prompt_mask == prompt_mask[first]).all(-1)  # [B]
    same_ids = ((prompt_ids == prompt_ids[first]) | (prompt_mask == 0)).all(-1)  # [B]
    if not bool((same_mask & same_ids).all()):
        row = int(torch.nonzero(~(same_mask & same_ids))[0])
        raise ValueError(
            f"row {row} has the group_id of row {int(first[row])} but a different prompt: "
            "the rows of a group must share their prompt"
        )


def packed_lengths(batch: TensorDict, spans: list[tuple[int, int]]) -> list[int]:
    """Packed row length of each group: its prompt once plus all its answers."""
    p_len = batch["prompt_mask"].sum(-1)  # [B]
    r_len = batch["response_mask"].sum(-1)  # [B]
    return [int(p_len[s]) + int(r_len[s:e].sum()) for s, e in spans]


def pack_groups(batch: TensorDict, pad_id: int = 0, dense_mask: bool = True) -> PackedGroups:
    """Lay ``batch`` out as one row per group (module docstring); ``batch`` holds ``prompt_ids``/``prompt_mask``
    ``[B, Lp]`` (left-padded), ``response_ids``/``response_mask`` ``[B, Lr]`` (right-padded) and ``group_id``
    ``[B]``; ``pad_id`` fills packed padding, which no real token attends. ``dense_mask=False`` leaves the mask
    out (shared-prefix attention, :mod:`grpo_rl.model.prefix_attention`, needs only the lengths)."""
    prompt_ids, prompt_mask = batch["prompt_ids"], batch["prompt_mask"]  # [B, Lp]
    response_ids, response_mask = batch["response_ids"], batch["response_mask"]  # [B, Lr]
    device = prompt_ids.device
    spans = group_spans(batch["group_id"])
    _check_shared_prompts(prompt_ids, prompt_mask, spans)
    lengths = packed_lengths(batch, spans)
    r, s = len(spans), max(lengths)
    input_ids = torch.full((r, s), pad_id, dtype=torch.long, device=device)
    position_ids = torch.zeros((r, s), dtype=torch.long, device=device)
    segment = torch.full((r, s), -1, dtype=torch.long, device=device)  # 0 prompt, i + 1 answer i, -1 padding
    r_len = response_mask.sum(-1).tolist()  # [B]
    source, rows, cols = [], [], []
    prompt_lens, answer_lens = [], []
    for g, (start, end) in enumerate(spans):
        prompt = prompt_ids[start][prompt_mask[start].bool()]  # [Lp_g]
        lp = prompt.numel()
        if lp == 0:
            raise ValueError(f"row {start} has an empty prompt: its first answer token has no predicting position")
        input_ids[g, :lp] = prompt
        prompt_lens.append(lp)
        answer_lens.append([int(n) for n in r_len[start:end]])
        position_ids[g, :lp] = torch.arange(lp, device=device)
        segment[g, :lp] = 0
        offset = lp
        for i, row in enumerate(range(start, end)):
            n = int(r_len[row])
            if n == 0:
                continue
            sl = slice(offset, offset + n)
            input_ids[g, sl] = response_ids[row, :n]
            position_ids[g, sl] = lp + torch.arange(n, device=device)
            segment[g, sl] = i + 1
            # Answer token 0 is predicted by the last prompt token, token t > 0 by answer token t - 1.
            pred = torch.cat(
                [torch.tensor([lp - 1], device=device), torch.arange(offset, offset + n - 1, device=device)]
            )
            source.append(g * s + pred)
            rows.append(torch.full((n,), row, dtype=torch.long, device=device))
            cols.append(torch.arange(n, device=device))
            offset += n
    allowed = _dense_mask(segment) if dense_mask else None
    empty = torch.zeros(0, dtype=torch.long, device=device)
    source_index = torch.cat(source) if source else empty
    target_row = torch.cat(rows) if rows else empty
    target_col = torch.cat(cols) if cols else empty
    return PackedGroups(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=allowed,
        source_index=source_index,
        target_row=target_row,
        target_col=target_col,
        target_ids=response_ids[target_row, target_col],
        prompt_len=prompt_lens,
        answer_lens=answer_lens,
    )


def _dense_mask(segment: torch.Tensor) -> torch.Tensor:
    """``[R, 1, S, S]`` bool from ``segment`` ``[R, S]`` (0 prompt, ``i + 1`` answer ``i``, -1 padding)."""
    s = segment.shape[1]
    seg_q, seg_k = segment.unsqueeze(2), segment.unsqueeze(1)  # [R, S, 1], [R, 1, S]
    idx = torch.arange(s, device=segment.device)
    causal = idx.unsqueeze(1) >= idx.unsqueeze(0)  # [S, S]
    allowed = causal & ((seg_k == 0) | (seg_k == seg_q)) & (seg_k >= 0) & (seg_q >= 0)  # [R, S, S]
    # A padding query attends to itself only, so no softmax row is empty (an empty row gives NaN in sdpa).
    allowed |= torch.eye(s, dtype=torch.bool, device=segment.device) & (seg_q < 0)
    return allowed.unsqueeze(1)


def micro_batches(batch: TensorDict, token_budget: int) -> list[TensorDict]:
    """Split ``batch`` into consecutive micro-batches of at most ``token_budget`` padded tokens each (a longer row
    forms one alone), each trimmed to its own longest prompt and answer."""
    p_len = batch["prompt_mask"].sum(-1)  # [N]
    r_len = batch["response_mask"].sum(-1)  # [N]
    chunks, start = [], 0
    n = batch.batch_size[0]
    while start < n:
        end = start + 1
        while end < n:
            width = int(p_len[start : end + 1].max() + r_len[start : end + 1].max())
            if width * (end + 1 - start) > token_budget:
                break
            end += 1
        chunks.append(trim_padding(batch[start:end]))
        start = end
    return chunks


def trim_padding(mb: TensorDict) -> TensorDict:
    lp = max(1, int(mb["prompt_mask"].sum(-1).max()))
    lr = max(1, int(mb["response_mask"].sum(-1).max()))
    out = mb.clone(recurse=False)
    for key in ("prompt_ids", "prompt_mask"):
        out.set(key, mb[key][:, -lp:])
    for key in ("response_ids", "response_mask", "loss_mask", "behavior_logprobs", "ref_logprobs", "old_logprobs"):
        if key in mb.keys():
            out.set(key, mb[key][:, :lr])
    return out


def group_micro_batches(batch: TensorDict, token_budget: int) -> list[TensorDict]:
    """Split ``batch`` into consecutive micro-batches of whole groups (runs of one ``group_id``), each of at most
    ``token_budget`` packed tokens, ``groups x longest packed row`` (a longer group forms one alone); rows keep
    their order and padding."""
    spans = group_spans(batch["group_id"])
    lengths = packed_lengths(batch, spans)
    chunks, first = [], 0
    while first < len(spans):
        last = first + 1
        while last < len(spans) and max(lengths[first : last + 1]) * (last + 1 - first) <= token_budget:
            last += 1
        chunks.append(batch[spans[first][0] : spans[last - 1][1]])
        first = last
    return chunks
