"""The samples a run shows every ``logger.examine_every`` steps: which rows, their record, their console line.

:func:`examine_rows` picks the first answer of up to ``logger.num_examine`` groups spread over the batch (the
first group and the last one, and evenly between), so that the samples show several prompts rather than one
prompt's answers. :func:`sample_record` is the row written to ``samples.jsonl``: the original fields ``step``,
``prompt``, ``response``, ``reward`` and ``reward_<component>``, then ``group``, ``reference`` and ``advantage``
where the batch has them. :func:`sample_line` is its one-line console form, texts cut to their heads.

Given a :class:`TokenDetail`, the row also holds ``answers``: every answer of its group, token by token
(:func:`group_answers`), which the run's report (:mod:`grpo_rl.run.report`) colours. Per token: its text, the
engine's log-prob (``behavior_logprobs``), the learner's (``learner_logprobs``, pi_old before the update: set by a
learner in the driver's process, absent for a data-parallel learner group), the tokens whose engine weight
``pi_old / mu`` fell outside the correction's bounds (truncated or masked, as :mod:`grpo_rl.algo.engine_correction`
decides), the weight version that sampled it (``behavior_version``, served engines; otherwise the answer's one
``policy_version``) and the runs of tool and template tokens (``loss_mask`` 0) of a multi-turn episode.
Log-probs are rounded to 3 decimals, rewards and advantages to 4; importance weights and gaps are not stored: they
follow from the two log-probs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from grpo_rl.algo.loss import LossSettings

__all__ = ["TokenDetail", "examine_rows", "group_answers", "sample_line", "sample_record"]

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
    if "group_index" in keys:  # the group's place in the prompt stream (groups arrive as they finish)
        row["group_index"] = int(batch["group_index"][i])
    if "reference" in keys:
        row["reference"] = _plain_json(batch["reference"][i])
    if "advantage" in keys:
        row["advantage"] = float(batch["advantage"][i])
    return row


@dataclass(frozen=True)
class TokenDetail:
    """What :func:`group_answers` needs besides the batch: the tokenizer and the loss's settings (its engine
    correction marks the tokens it cut)."""

    tokenizer: Any
    loss: LossSettings = field(default_factory=LossSettings)

    @classmethod
    def from_config(cls, tokenizer, policy, sampling) -> TokenDetail:
        return cls(tokenizer, LossSettings.from_config(policy, sampling))


def _rounded(values: torch.Tensor) -> list[float]:
    return [round(v, 3) for v in values.tolist()]


def _runs(flags: list[bool]) -> list[list[int]]:
    """``[start, end)`` of each run of True in ``flags``."""
    runs: list[list[int]] = []
    for t, flag in enumerate(flags):
        if flag and runs and runs[-1][1] == t:
            runs[-1][1] = t + 1
        elif flag:
            runs.append([t, t + 1])
    return runs


def group_answers(batch: TensorDict, i: int, reward_keys: list[str], detail: TokenDetail) -> list[dict[str, Any]]:
    """Every answer of row ``i``'s group, token by token (the module docstring lists the fields)."""
    keys = batch.keys()
    if "group_id" in keys:
        rows = (batch["group_id"] == batch["group_id"][i]).nonzero().flatten().tolist()
    else:
        rows = [i]
    mask_BT = batch["response_mask"][rows].bool()  # [G, Lr]
    model_BT = batch["loss_mask"][rows].bool() & mask_BT if "loss_mask" in keys else mask_BT  # [G, Lr]
    engine_BT = batch["behavior_logprobs"][rows].float()  # [G, Lr]
    learner_BT = batch["learner_logprobs"][rows].float() if "learner_logprobs" in keys else None  # [G, Lr]
    weights = None if learner_BT is None else detail.loss.engine_weights(learner_BT, engine_BT, model_BT)
    outside_BT = None if weights is None else weights.outside_BT
    answers = []
    for j, r in enumerate(rows):
        n = int(mask_BT[j].sum())
        ids = batch["response_ids"][r, :n].tolist()
        answer: dict[str, Any] = {"response": batch["response_text"][r], "reward": round(float(batch["reward"][r]), 4)}
        answer.update({k: round(float(batch[k][r]), 4) for k in reward_keys})
        if "advantage" in keys:
            answer["advantage"] = round(float(batch["advantage"][r]), 4)
        if "truncated" in keys:
            answer["truncated"] = bool(batch["truncated"][r])
        answer["tokens"] = detail.tokenizer.batch_decode([[t] for t in ids])
        answer["logprob"] = _rounded(engine_BT[j, :n])
        if learner_BT is not None:
            answer["learner_logprob"] = _rounded(learner_BT[j, :n])
        if outside_BT is not None:
            answer["engine_outside"] = (outside_BT[j, :n] & model_BT[j, :n]).nonzero().flatten().tolist()
        if "behavior_version" in keys:
            answer["version"] = [int(v) for v in batch["behavior_version"][r, :n].tolist()]
        elif "policy_version" in keys:
            answer["policy_version"] = int(batch["policy_version"][r])
        context = _runs([not m for m in model_BT[j, :n].tolist()])
        if context:
            answer["context"] = context
        answers.append(answer)
    return answers


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
