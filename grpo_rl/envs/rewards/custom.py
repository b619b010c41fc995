"""A user's reward functions, loaded from Python files named in the config.

A reward function has the signature every reward here has, plus keyword columns::

    def my_reward(responses: list[str], references: list[Any], **columns) -> list[float]: ...

``responses[i]`` is one sampled answer, ``references[i]`` its prompt's ground truth, and each keyword is one
data column, a list aligned with ``responses``. A function receives only the columns its signature names
(all of them when it takes ``**columns``), so ``def f(responses, references)`` works on any data set.
Functions written for verl (``compute_score(data_source, solution_str, ground_truth, extra_info=None)``) or TRL
(``reward_func(prompts, completions, **kwargs)``) are recognised by their parameter names when the file is
loaded and called through an adapter (:mod:`grpo_rl.envs.rewards.conventions`).

Each call runs under ``reward.timeout_seconds`` (see :mod:`grpo_rl.envs.rewards.base`): a call that takes longer
counts as a failure of its samples, which get ``reward.fallback``, and the run goes on.

Files are imported once per process (keyed by path and modification time), so validating the config and
building the environment do not run a file's top-level code twice. Every loading problem raises
:class:`RewardLoadError` naming the config key (``reward.path``, ``reward.functions[1].name``) and the fix.
See docs/custom_tasks.md.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_rl.envs.rewards.base import RewardComponent, function_origin
from grpo_rl.envs.rewards.conventions import ConventionError, adapt_reward
from grpo_rl.envs.user_files import user_function
from grpo_rl.errors import ConfigError

__all__ = ["RewardLoadError", "UserReward", "load_reward_function", "user_reward_components"]

DOCS = "see docs/custom_tasks.md"


class RewardLoadError(ConfigError):
    """A configured reward function cannot be loaded or has the wrong signature."""


class UserReward:
    """A user's reward function in any accepted convention (:mod:`grpo_rl.envs.rewards.conventions`), called as ours:
    ``(responses, references, **columns) -> list``, with the data columns its signature accepts; ``key`` and
    ``path`` name it in errors."""

    def __init__(
        self,
        fn: Callable,
        key: str = "reward.name",
        *,
        path: str | None = None,
        prompt_column: str | None = None,
        reference_column: str | None = None,
    ):
        self.fn = fn
        self.key = key
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        try:
            self.adapter = adapt_reward(fn, prompt_column=prompt_column, reference_column=reference_column)
        except ConventionError as e:
            try:
                signature = f"{self.__name__}{inspect.signature(fn)}"
            except (TypeError, ValueError):
                signature = f"{self.__name__}(?)"
            where = f" in {path}" if path else ""
            raise RewardLoadError(f"{key}={self.__name__} has signature {signature}{where}: {e} ({DOCS})") from e
        self.convention = self.adapter.convention
        self.takes_all_columns = self.adapter.takes_all_columns
        self.columns = self.adapter.columns
        self.required_columns = self.adapter.required_columns

    @property
    def allows_none(self) -> bool:
        """TRL's None means "no reward for this answer": the answer gets the fallback, and a step of Nones goes on."""
        return self.convention == "trl"

    def check_columns(self, available: Iterable[str]) -> None:
        """Raise if the function requires a column that the data does not have."""
        available = set(available)
        missing = [c for c in self.required_columns if c not in available]
        if missing:
            raise RewardLoadError(
                f"{self.key}={self.__name__} requires column(s) {missing}, but the data passes only "
                f"{sorted(available) or 'no columns'}; add them to the data (and env.extra_columns), "
                f"or give the parameters defaults"
            )

    def __call__(self, responses: Sequence[str], references: Sequence[Any], **columns: Sequence[Any]) -> list:
        out = self.adapter(responses, references, **columns)  # each adapter passes only what its function takes
        return out.tolist() if hasattr(out, "tolist") else out  # numpy arrays and tensors -> plain floats


def load_reward_function(
    path: str, name: str, *, key: str = "reward", prompt_column: str | None = None, reference_column: str | None = None
) -> UserReward:
    """Import ``path`` and return its top-level function ``name``, signature-checked and adapted to our convention.

    Args:
        key: config prefix for error messages: ``"reward"`` or ``"reward.functions[2]"``.
        prompt_column: the column holding each answer's raw prompt (TRL's ``prompts``).
        reference_column: the data column the references come from (TRL functions get it by that name too).

    Raises:
        RewardLoadError: the file is missing or fails to import, the name is missing or not callable, or the
            signature matches none of ours, verl's and TRL's (the message lists all three).
    """
    fn = user_function(path, name, key, error=RewardLoadError, docs=DOCS)
    if not callable(fn):
        raise RewardLoadError(f"{key}.name={name}: {name!r} in {path} is a {type(fn).__name__}, not a function")
    return UserReward(fn, key=f"{key}.name", path=path, prompt_column=prompt_column, reference_column=reference_column)


@dataclass(frozen=True)
class RewardFunction:
    """A reward function given as a Python object rather than a file (the Python API's ``rewards``).

    Attributes:
        fn: the callable, in any accepted convention (ours, verl's or TRL's).
        weight: its weight in the summed reward.
        label: logged as ``reward_<label>``; default: the function's name.
    """

    fn: Callable
    weight: float = 1.0
    label: str | None = None


def user_reward_components(
    reward_cfg,
    *,
    prompt_column: str | None = None,
    reference_column: str | None = None,
    functions: Sequence[RewardFunction] = (),
) -> list[RewardComponent]:
    """The reward components named by ``reward.path``/``reward.name`` (weight 1) and ``reward.functions``, then
    ``functions`` (Python objects, named ``rewards[i]`` in errors), each with ``reward.timeout_seconds`` per call and
    logged as ``reward_<label or function name>`` (a name used twice is an error)."""
    timeout = getattr(reward_cfg, "timeout_seconds", None)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise RewardLoadError(
            f"reward.timeout_seconds={timeout} must be > 0 (seconds one reward call may take), or null for no limit"
        )
    specs = []
    if reward_cfg.path:
        specs.append(("reward", reward_cfg.path, reward_cfg.name, 1.0, None))
    for i, f in enumerate(reward_cfg.functions):
        specs.append((f"reward.functions[{i}]", f.path, f.name, f.weight, f.label))
    for i, f in enumerate(functions):
        specs.append((f"rewards[{i}]", None, f, f.weight, f.label))
    components, seen = [], {}
    for key, path, name, weight, label in specs:
        if path is None:  # a Python object
            fn = UserReward(name.fn, key=key, prompt_column=prompt_column, reference_column=reference_column)
            origin = function_origin(name.fn)
            name = fn.__name__
        else:
            fn = load_reward_function(
                path, name, key=key, prompt_column=prompt_column, reference_column=reference_column
            )
            origin = f"{path}:{name}"
        label = label or name
        if label in seen:
            raise RewardLoadError(
                f"{key} and {seen[label]} are both logged as reward_{label}; give one a distinct "
                f"label, e.g. reward.functions=[{{path: ..., name: {name}, label: {label}_2}}]"
            )
        seen[label] = key
        components.append(
            RewardComponent(
                label,
                fn,
                float(weight),
                timeout_seconds=None if timeout is None else float(timeout),
                none_is_no_reward=fn.allows_none,
                origin=origin,
            )
        )
    return components
