"""Multi-turn, tool-using episodes whose training tokens are the engine's, exact by construction.

An episode starts from a prompt's ids. The model samples a turn, stopping at the close of a tool call
(:data:`~grpo_rl.envs.tools.format.TOOL_CALL_CLOSE`) or at its end of turn. A turn that calls a tool gets the tool's
reply as a ``tool`` message, and the model samples the next turn from everything so far, up to ``max_turns``
turns; the last turn's text is the answer the reward scores.

**Token-exact.** Nothing the model produced is ever re-tokenised. Each turn's context is the previous context's ids
plus the new ids: the ids the engine sampled, then the ids of the tool message, rendered once by the chat template
(:class:`ToolMessages`: the template's close of the assistant turn, the tool message, the opening of the next
assistant turn). So the sequence the learner scores is exactly the one the engine generated from, turn by turn;
re-rendering the conversation as text and tokenising it again would not be (a tool call may end inside a token,
and templates may drop or rewrite earlier turns). ``loss_mask`` marks the model's tokens: the loss, the importance
ratios, the KL and the entropy cover those only; tool and template tokens are context.

Batch layout: :mod:`grpo_rl.engines.base`'s, where ``response_ids``/``response_mask`` hold everything after the
prompt (model, tool and template tokens) and ``behavior_logprobs`` is the engine's log-prob on model tokens (0 on
the others), plus ``loss_mask`` ``[N, Lr]`` and, per episode, ``turns``, ``tool_calls`` and ``tool_errors``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from tensordict import TensorDict

from grpo_rl.engines.base import RolloutEngine, SamplingSpec
from grpo_rl.envs.tools.calculator import KINDS as CALCULATOR_KINDS
from grpo_rl.envs.tools.format import TOOL_CALL_CLOSE, ToolCall, ToolCallError, parse_tool_call
from grpo_rl.envs.tools.registry import Tool, call_tool

_SENTINEL = "\u2063grpo-rl-turn\u2063"

# Kinds of tool errors, counted per episode: a malformed call, a call to a tool that does not exist, arguments the
# tool does not take, the calculator's own kinds (its "timeout" also counts any tool past its timeout_seconds),
# another error a tool reported (ToolError), a tool that raised, a reply that is no text.
ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", *CALCULATOR_KINDS, "tool_error", "exception", "bad_output")


class ToolMessages:
    """A tool's reply as token ids, rendered once by ``tokenizer``'s chat template: what the template puts between
    the call and the model's next words (the end of the calling turn, the ``tool`` message, the next turn's start).

    Raises:
        ValueError: the chat template cannot render a ``tool`` message after an assistant turn as a continuation of
            the text before it.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        user = {"role": "user", "content": "?"}
        assistant = {"role": "assistant", "content": _SENTINEL}
        base = tokenizer.apply_chat_template([user, assistant], tokenize=False)
        full = tokenizer.apply_chat_template(
            [user, assistant, {"role": "tool", "content": _SENTINEL + "R"}], add_generation_prompt=True, tokenize=False
        )
        if not full.startswith(base) or _SENTINEL not in base:
            raise ValueError(
                "the tokenizer's chat template does not render a tool message after an assistant turn as "
                "a continuation of the conversation; multi-turn tool use needs one that does"
            )
        self._close = base[base.index(_SENTINEL) + len(_SENTINEL) :]  # e.g. "<|im_end|>\n"
        before, after = full[len(base) :].split(_SENTINEL + "R")
        self._before, self._after = before, after  # e.g. "<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n"

    def render(self, reply: str) -> list[int]:
        """The ids between a turn that ended with a tool call and the model's next turn."""
        text = self._close + self._before + reply + self._after
        return self.tokenizer.encode(text, add_special_tokens=False)


@dataclass
class ToolUse:
    """The tools of an environment by name, and what a turn's text asks of them; replies past ``max_chars`` are cut
    (and say so), and each call runs under its tool's ``timeout_seconds``."""

    tools: dict[str, Tool]
    max_chars: int = 500
    # calls past their limit still running, per tool: a tool that hangs is not called while too many of them run
    _abandoned: dict[str, list[threading.Thread]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_abandoned"] = {}  # threads do not pickle, and belong to this process anyway
        return state

    def respond(self, text: str) -> tuple[str, str | None, bool] | None:
        """The reply to the first tool call in ``text``: ``(reply, error kind or None, a call was made)``; None when
        the text makes no call (the turn is an answer). An unclosed call is an answer too (sampling stopped for
        another reason)."""
        call = parse_tool_call(text)
        if call is None:
            return None
        if isinstance(call, ToolCallError):
            if call.kind == "unclosed":
                return None
            return call.message, call.kind, True
        assert isinstance(call, ToolCall)
        tool = self.tools.get(call.name)
        if tool is None:
            return (f"error: no tool named {call.name!r}; tools: {', '.join(sorted(self.tools))}", "unknown_tool", True)
        reply, error = call_tool(
            tool, call.arguments, max_chars=self.max_chars, abandoned=self._abandoned.setdefault(tool.name, [])
        )
        return reply, error, True


@dataclass
class Episode:
    """One multi-turn answer."""

    ids: list[int] = field(default_factory=list)  # every token after the prompt: the model's and the tool messages'
    model: list[bool] = field(default_factory=list)  # per token of ids: True where the model sampled it
    logprobs: list[float] = field(default_factory=list)  # per token of ids: the engine's (0 on tool tokens)
    turns: int = 0  # model turns sampled
    tool_calls: int = 0  # well-formed or not
    tool_errors: Counter = field(default_factory=Counter)  # by kind: malformed call, unknown tool, bad arguments, ...
    answer_ids: list[int] = field(default_factory=list)  # the last turn's: the reward's text is decoded from them
    # ended at a length limit (max_new_tokens, or max_total_tokens outgrown) or on a tool call at max_turns
    truncated: bool = False
    done: bool = False

    def add_turn(self, ids: list[int], logprobs: list[float]) -> None:
        self.ids += ids
        self.model += [True] * len(ids)
        self.logprobs += logprobs
        self.answer_ids = list(ids)
        self.turns += 1

    def add_context(self, ids: list[int]) -> None:
        self.ids += ids
        self.model += [False] * len(ids)
        self.logprobs += [0.0] * len(ids)


def _rows(batch: TensorDict) -> list[tuple[list[int], list[float], bool]]:
    """The engine batch's answers as ``(ids, logprobs, truncated)`` per row, padding removed."""
    out = []
    for ids, mask, lp, trunc in zip(
        batch["response_ids"], batch["response_mask"], batch["behavior_logprobs"], batch["truncated"], strict=True
    ):
        n = int(mask.sum())
        out.append((ids[:n].tolist(), lp[:n].tolist(), bool(trunc)))
    return out


def run_episodes(
    engine: RolloutEngine,
    prompts: Sequence[Sequence[int]],
    n: int,
    sampling: SamplingSpec,
    *,
    tools: ToolUse,
    messages: ToolMessages,
    decode: Callable[[list[int]], str],
    max_turns: int,
    max_total_tokens: int,
) -> list[Episode]:
    """Sample ``n`` multi-turn episodes per prompt (module docstring), those of prompt ``i`` at ``i*n .. i*n+n-1``;
    turn ``t`` is seeded from ``sampling.seed`` and ``t``, and an episode whose next turn could not fit in
    ``max_total_tokens`` ends, truncated."""
    stop = tuple(sampling.stop) + ((TOOL_CALL_CLOSE,) if TOOL_CALL_CLOSE not in sampling.stop else ())
    first = engine.generate(list(prompts), n, replace(sampling, stop=stop))
    episodes = [Episode() for _ in range(len(prompts) * n)]
    contexts = [list(prompts[j // n]) for j in range(len(episodes))]
    pending = list(range(len(episodes)))
    rows = _rows(first)
    for turn in range(max_turns):
        going = []
        for j, (ids, lps, truncated) in zip(pending, rows, strict=True):
            ep = episodes[j]
            ep.add_turn(ids, lps)
            if truncated:
                ep.truncated = True
                continue
            answer = tools.respond(decode(ids))
            if answer is None:
                continue
            reply, error, _ = answer
            ep.tool_calls += 1
            if error is not None:
                ep.tool_errors[error if error in ERROR_KINDS else "tool_error"] += 1
            if turn + 1 >= max_turns:
                ep.truncated = True  # a call left unanswered: no turn remains for the answer
                continue
            ep.add_context(messages.render(reply))
            if len(contexts[j]) + len(ep.ids) + sampling.max_new_tokens > max_total_tokens:
                ep.truncated = True
                continue
            going.append(j)
        if not going:
            break
        seed = None if sampling.seed is None else sampling.seed + 7919 * (turn + 1)
        batch = engine.generate(
            [contexts[j] + episodes[j].ids for j in going], 1, replace(sampling, stop=stop, seed=seed)
        )
        pending, rows = going, _rows(batch)
    return episodes


def pack_episodes(prompts: Sequence[Sequence[int]], episodes: Sequence[Episode], n: int, pad_id: int) -> TensorDict:
    """The batch of ``episodes`` (:mod:`grpo_rl.engines.base`'s layout plus ``loss_mask``, ``turns``,
    ``tool_calls`` and ``tool_error_kinds`` ``[N, len(ERROR_KINDS)]``)."""
    num = len(episodes)
    lp = max(len(p) for p in prompts)
    lr = max(1, max(len(e.ids) for e in episodes))
    prompt_ids = torch.full((num, lp), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((num, lp), dtype=torch.long)
    response_ids = torch.full((num, lr), pad_id, dtype=torch.long)
    response_mask = torch.zeros((num, lr), dtype=torch.long)
    loss_mask = torch.zeros((num, lr), dtype=torch.long)
    behavior = torch.zeros((num, lr), dtype=torch.float32)
    for j, ep in enumerate(episodes):
        p = prompts[j // n]
        prompt_ids[j, lp - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        prompt_mask[j, lp - len(p) :] = 1
        k = len(ep.ids)
        if k:
            response_ids[j, :k] = torch.as_tensor(ep.ids, dtype=torch.long)
            response_mask[j, :k] = 1
            loss_mask[j, :k] = torch.as_tensor(ep.model, dtype=torch.long)
            behavior[j, :k] = torch.as_tensor(ep.logprobs, dtype=torch.float32)
    return TensorDict(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "loss_mask": loss_mask,
            "behavior_logprobs": behavior,
            "group_id": torch.arange(num) // n,
            "truncated": torch.tensor([e.truncated for e in episodes], dtype=torch.bool),
            "turns": torch.tensor([e.turns for e in episodes], dtype=torch.long),
            "tool_calls": torch.tensor([e.tool_calls for e in episodes], dtype=torch.long),
            "tool_error_kinds": torch.tensor(
                [[e.tool_errors.get(k, 0) for k in ERROR_KINDS] for e in episodes], dtype=torch.long
            ).view(num, len(ERROR_KINDS)),
        },
        batch_size=[num],
    )


def tool_metrics(batch: TensorDict) -> dict[str, float]:
    """Per step, from a batch of episodes: turns per episode, tool calls per episode, the fraction of episodes that
    called a tool, and tool errors (all, and by kind: ``tool_errors_<kind>``, the kinds that occurred)."""
    kinds = batch["tool_error_kinds"].sum(0)  # [K]
    out = {
        "turns_mean": float(batch["turns"].float().mean()),
        "tool_calls_mean": float(batch["tool_calls"].float().mean()),
        "tool_call_rate": float((batch["tool_calls"] > 0).float().mean()),
        "tool_errors": float(kinds.sum()),
    }
    out.update({f"tool_errors_{kind}": float(c) for kind, c in zip(ERROR_KINDS, kinds.tolist(), strict=True) if c})
    return out
