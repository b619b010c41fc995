"""The samples a run shows every ``logger.examine_every`` steps: which rows, their record, their console line.

:func:`examine_rows` picks the first answer of up to ``logger.num_examine`` groups spread over the batch (the
first group and the last one, and evenly between), so that the samples show several prompts rather than one
prompt's answers. :func:`sample_record` is the row written to ``samples.jsonl``: the original fields ``step``,
``prompt``, ``response``, ``reward`` and ``reward_<component>``, then ``group``, ``reference`` and ``advantage``
where the batch has them. :func:`sample_line` is its one-line console form, texts cut to their heads.
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch
from tensordict import TensorDict

__all__ = ["examine_rows", "sample_line", "sample_record"]

PROMPT_CHARS = 70
ANSWER_CHARS = 110
REFERENCE_CHARS = 40

# Chat-template markup: <|im_start|>, <|start_header_id|>, ... A role name right after it is markup too.
_SPECIAL = re.compile(r"<\|[^|<>]*\|>")
_ROLE = re.compile(r"^\s*(?:system|user|assistant)\s*(?:\n|$)")


def examine_rows(group_id: torch.Tensor | None, n_rows: int, num: int) -> list[int]:
    """Row indices of the samples to show: the first answer of up to ``num`` groups, spread over the ``n_rows``
    rows (``group_id`` ``[N]`` None: every row is its own group)."""
    if num <= 0 or n_rows == 0:
        return []
    if group_id is None:
        first = list(range(n_rows))
    else:
        seen: dict[int, int] = {}
        for i, g in enumerate(group_id.tolist()):
            seen.setdefault(int(g), i)
        first = sorted(seen.values())  # groups in batch order
    if num >= len(first):
        return first
    if num == 1:
        return [first[0]]
    picks = sorted({round(k * (len(first) - 1) / (num - 1)) for k in range(num)})
    return [first[p] for p in picks]


def _plain_json(value: Any) -> Any:
    """``value`` if JSON can hold it as is, else its ``str`` (a reference may be any object)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def sample_record(step: int, batch: TensorDict, i: int, reward_keys: list[str]) -> dict[str, Any]:
    """Row ``i`` of ``batch`` as written to ``samples.jsonl``."""
    keys = batch.keys()
    row: dict[str, Any] = {
        "step": step,
        "prompt": batch["prompt"][i],
        "response": batch["response_text"][i],
        "reward": float(batch["reward"][i]),
    }
    if "episode_text" in keys:  # a multi-turn episode: "response" is its last turn, the text the reward scored
        row["episode"] = batch["episode_text"][i]
    row.update({k: float(batch[k][i]) for k in reward_keys})
    if "group_id" in keys:
        row["group"] = int(batch["group_id"][i])
    if "reference" in keys:
        row["reference"] = _plain_json(batch["reference"][i])
    if "advantage" in keys:
        row["advantage"] = float(batch["advantage"][i])
    return row


def last_turn(prompt: str) -> str:
    """The last message's text of a chat-formatted prompt (the question, without the template's system turn and
    markup); the prompt itself when it has no chat markup."""
    pieces = [_ROLE.sub("", piece).strip() for piece in _SPECIAL.split(prompt)]
    pieces = [p for p in pieces if p]
    return pieces[-1] if pieces else prompt


def _head(text: Any, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sample_line(record: dict[str, Any]) -> str:
    """One console line for a :func:`sample_record`: group, prompt and answer heads, reference, reward with its
    components, advantage."""
    components = ", ".join(f"{k[len('reward_') :]} {v:.3g}" for k, v in record.items() if k.startswith("reward_"))
    parts = [
        f"group {record['group']}" if "group" in record else None,
        f"prompt: {_head(last_turn(record['prompt']), PROMPT_CHARS)}",
        f"answer: {_head(record['response'], ANSWER_CHARS)}",
        f"ref: {_head(record['reference'], REFERENCE_CHARS)}" if "reference" in record else None,
        f"reward {record['reward']:.3g}" + (f" ({components})" if components else ""),
        f"adv {record['advantage']:+.2f}" if "advantage" in record else None,
    ]
    return " | ".join(p for p in parts if p is not None)
