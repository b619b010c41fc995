"""The three calling conventions a user's reward function may follow, recognised by its parameter names.

Detected once, with :func:`inspect.signature`, when the file is loaded (before any engine starts), in this order:

* **verl** (a parameter named ``solution_str``)::

      def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict: ...

  Called once per answer with keywords, as verl's ``NaiveRewardManager`` calls ``custom_reward_function``:
  ``solution_str`` is the answer, ``ground_truth`` its reference, ``data_source`` the data's ``data_source``
  column (None when there is none), ``extra_info`` the data's ``extra_info`` column, or, when the data has none,
  a dict of the columns passed to the reward. A dict result gives its ``"score"`` (verl's other keys are
  dropped). Departure: verl's ``reward_kwargs`` are not supported; extra parameters need defaults.
* **TRL** (a parameter named ``completions``)::

      def reward_func(prompts, completions, **kwargs) -> list[float | None]: ...

  Called once per batch with keywords, as TRL's ``GRPOTrainer`` calls it: ``prompts`` are the raw prompts (the
  task's prompt column: a string, or a list of chat messages; None when the data passes no prompt column),
  ``completions`` the answers (as ``[{"role": "assistant", "content": ...}]`` when the prompt is a list of
  messages, TRL's conversational format), and the keywords are the data columns but ``prompt``, plus the
  references as ``ground_truth`` and under the file task's ``env.ground_truth_column`` name (a data column of
  the same name wins). ``None`` means no reward for that answer: it gets ``reward.fallback`` and counts as a
  failure, but a step in which every answer got None does not stop the run. Departure: ``completion_ids`` and
  ``trainer_state`` are not passed.
* **ours** (anything else whose first two parameters are positional)::

      def my_reward(responses, references, **columns) -> list[float]: ...

  See :mod:`grpo_rl.envs.rewards.custom`.

Every adapter is a callable ``(responses, references, **columns) -> list`` (:data:`~grpo_rl.envs.rewards.base.RewardFn`
with columns) that also says which columns it reads (``columns``, ``takes_all_columns``) and which it cannot do
without (``required_columns``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ACCEPTED_SIGNATURES", "ConventionError", "NativeReward", "TrlReward", "VerlReward", "adapt_reward"]

ACCEPTED_SIGNATURES = (
    "(responses, references, **columns) -> list[float] (this library's), "
    "compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float or {'score': float} (verl), "
    "reward_func(prompts, completions, **kwargs) -> list[float | None] (TRL)"
)

VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
# What TRL passes that is not a data column; the two it passes that we cannot are rejected when required.
TRL_FIXED = ("prompts", "completions")
TRL_UNAVAILABLE = ("completion_ids", "trainer_state")


class ConventionError(ValueError):
    """A function fits no convention, or fits one but cannot be called here; the message says why (the loader
    adds the config key and file)."""


def _params(fn: Callable) -> list[inspect.Parameter]:
    return list(inspect.signature(fn).parameters.values())


def _takes_var_keyword(params: Sequence[inspect.Parameter]) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in params)


def _keyword_names(params: Sequence[inspect.Parameter]) -> list[str]:
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _check_keyword_callable(params: Sequence[inspect.Parameter], convention: str) -> None:
    positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY]
    if positional_only:
        raise ConventionError(
            f"{convention} functions are called with keywords, but {positional_only} are "
            "positional-only; remove the '/' from the signature"
        )


class NativeReward:
    """``fn(responses, references, **columns)``: called as is, with only the columns its signature names."""

    convention = "grpo_rl"

    def __init__(self, fn: Callable):
        params = _params(fn)
        self.fn = fn
        self.takes_all_columns = _takes_var_keyword(params)
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        keyword = [p for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        self.columns = tuple(p.name for p in keyword)
        self.required_columns = tuple(p.name for p in keyword if p.default is p.empty)
        extra_positional = [p.name for p in positional[2:] if p.default is p.empty and p.kind is p.POSITIONAL_ONLY]
        if extra_positional:
            raise ConventionError(
                f"positional-only parameters {extra_positional} cannot be filled; make them "
                "keyword parameters named after data columns"
            )

    @staticmethod
    def matches(params: Sequence[inspect.Parameter]) -> bool:
        """Only the first two (responses, references) are positional; the rest must be columns."""
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)

    def __call__(self, responses: Sequence[str], references: Sequence[Any], **columns: Sequence[Any]) -> Any:
        if not self.takes_all_columns:
            columns = {k: v for k, v in columns.items() if k in self.columns}
        return self.fn(list(responses), list(references), **columns)


class VerlReward:
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, once per answer."""

    convention = "verl"
    takes_all_columns = True  # extra_info falls back to a dict of every column
    columns = ("data_source", "extra_info")
    required_columns = ()

    def __init__(self, fn: Callable):
        params = _params(fn)
        _check_keyword_callable(params, "verl")
        unfilled = [
            p.name
            for p in params
            if p.default is p.empty and p.name not in VERL_ARGS and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        if unfilled:
            raise ConventionError(
                f"verl-style parameters {unfilled} cannot be filled here (only {list(VERL_ARGS)} "
                "are passed; verl's reward_kwargs are not supported); give them defaults"
            )
        names = set(_keyword_names(params))
        self.fn = fn
        self.passed = VERL_ARGS if _takes_var_keyword(params) else tuple(a for a in VERL_ARGS if a in names)

    def __call__(self, responses: Sequence[str], references: Sequence[Any], **columns: Sequence[Any]) -> list:
        n = len(responses)
        data_source = columns.get("data_source", [None] * n)
        if "extra_info" in columns:
            extra_info = columns["extra_info"]
        else:
            extra_info = [{k: v[i] for k, v in columns.items()} for i in range(n)]
        scores = []
        for i in range(n):
            args = {
                "data_source": data_source[i],
                "solution_str": responses[i],
                "ground_truth": references[i],
                "extra_info": extra_info[i],
            }
            out = self.fn(**{k: args[k] for k in self.passed})
            if isinstance(out, dict):
                if "score" not in out:
                    raise TypeError(
                        f"returned a dict without a 'score' key (keys: {sorted(out)}); verl reward "
                        "functions return a float or a dict with 'score'"
                    )
                out = out["score"]
            scores.append(out)
        return scores


class TrlReward:
    """TRL's ``reward_func(prompts, completions, **kwargs)``, once per batch; ``prompt_column`` holds each answer's
    raw prompt (None: the task passes none), and ``reference_column`` is passed under its own name too."""

    convention = "trl"
    takes_all_columns = True

    def __init__(self, fn: Callable, *, prompt_column: str | None = None, reference_column: str | None = None):
        params = _params(fn)
        _check_keyword_callable(params, "TRL")
        required = [
            p.name
            for p in params
            if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in TRL_FIXED
        ]
        unavailable = [name for name in required if name in TRL_UNAVAILABLE]
        if unavailable:
            raise ConventionError(
                f"TRL's {unavailable} are not available here (rewards see text, not token ids "
                "or trainer state); give those parameters defaults"
            )
        self.fn = fn
        self.prompt_column = prompt_column
        self.reference_names = tuple(dict.fromkeys(n for n in ("ground_truth", reference_column) if n))
        self.accepts_all = _takes_var_keyword(params)
        self.accepted = set(_keyword_names(params))
        self.columns = tuple(n for n in _keyword_names(params) if n not in TRL_FIXED)
        self.required_columns = tuple(n for n in required if n not in self.reference_names)

    def __call__(self, responses: Sequence[str], references: Sequence[Any], **columns: Sequence[Any]) -> list:
        n = len(responses)
        prompts = list(columns.get(self.prompt_column, [None] * n)) if self.prompt_column else [None] * n
        completions = [
            [{"role": "assistant", "content": r}] if isinstance(p, list) else r
            for p, r in zip(prompts, responses, strict=True)
        ]
        # TRL passes every dataset column but the prompt as a keyword.
        kwargs = {k: list(v) for k, v in columns.items() if k != "prompt"}
        for name in self.reference_names:
            kwargs.setdefault(name, list(references))
        if not self.accepts_all:
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepted}
        for name, value in (("prompts", prompts), ("completions", completions)):
            if self.accepts_all or name in self.accepted:
                kwargs[name] = value
        return self.fn(**kwargs)


def adapt_reward(
    fn: Callable, *, prompt_column: str | None = None, reference_column: str | None = None
) -> NativeReward | VerlReward | TrlReward:
    """``fn`` wrapped in the adapter of the convention its parameter names match.

    Raises:
        ConventionError: the signature cannot be read, or matches no convention, or matches one but has
            parameters that cannot be filled.
    """
    try:
        params = _params(fn)
    except (TypeError, ValueError) as e:
        raise ConventionError(
            f"its signature cannot be read ({e}); wrap it in a def with one of the accepted "
            f"signatures: {ACCEPTED_SIGNATURES}"
        ) from e
    names = {p.name for p in params}
    if "solution_str" in names:
        return VerlReward(fn)
    if "completions" in names:
        return TrlReward(fn, prompt_column=prompt_column, reference_column=reference_column)
    if NativeReward.matches(params):
        return NativeReward(fn)
    raise ConventionError(f"it matches none of the accepted signatures: {ACCEPTED_SIGNATURES}")
