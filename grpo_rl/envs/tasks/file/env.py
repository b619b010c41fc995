"""A user's own task: prompts from local jsonl/json/parquet files or a Hugging Face data set, scored by the user's
reward functions.

``env.path`` is one file or a list of files, whose rows are concatenated in order; each file is checked on its
own, and errors name it. ``env.hub_dataset`` (with ``env.hub_config``) names a hub data set instead, whose
``env.split`` rows are checked and used exactly as a file's.

Each row needs a prompt column (``env.prompt_column``, default ``prompt``): a string sent as the user turn, or
a list of ``{"role", "content"}`` chat messages sent as is. ``env.ground_truth_column`` (default
``ground_truth``) is passed to the reward as ``references``; set it to null for rewards that need none. Every
other column (or just ``env.extra_columns``) is passed to the reward as a keyword list aligned with the
responses, the prompt column included. See docs/custom_tasks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from grpo_rl.config.schema import EnvConfig, RewardConfig
from grpo_rl.envs.base import PromptEnv
from grpo_rl.envs.data import load_hub_records, load_records
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent
from grpo_rl.errors import ConfigError, DataError

if TYPE_CHECKING:
    from grpo_rl.envs.multiturn import ToolUse


def file_messages(row: dict, *, prompt_column: str, system_prompt: str | None = None) -> list[dict]:
    """Chat messages for one row: the prompt as the user turn, or the row's own message list."""
    prompt = row[prompt_column]
    messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def _check_rows(records: Sequence[dict], prompt_column: str, ground_truth_column: str | None, where: str) -> None:
    for key, column in (("env.prompt_column", prompt_column), ("env.ground_truth_column", ground_truth_column)):
        if column is None:
            continue
        for i, row in enumerate(records):
            if column not in row:
                fix = "" if key == "env.prompt_column" else f", or {key}=null if your reward needs no ground truth"
                raise ConfigError(
                    f"{where}: row {i} has no column {key}={column!r} (columns: {sorted(row)}); "
                    f"set {key} to the right column{fix}"
                )
    for i, row in enumerate(records):
        prompt = row[prompt_column]
        is_messages = isinstance(prompt, list) and all(
            isinstance(m, dict) and "role" in m and "content" in m for m in prompt
        )
        if not (isinstance(prompt, str) and prompt.strip()) and not (is_messages and prompt):
            raise DataError(
                f"{where}: row {i} column {prompt_column!r} is {prompt!r:.80}; expected a non-empty "
                "string or a list of {role, content} messages: fix that row or remove it"
            )


def file_paths(path: Any) -> list[str]:
    """``env.path`` as a list: one file, or the files of a list."""
    return [path] if isinstance(path, str) else [str(p) for p in path]


def load_file_records(env: EnvConfig, split: str | None = None) -> list[dict]:
    """The rows of ``env.path``'s files concatenated in order, each file's rows checked (prompt and ground-truth
    columns present, prompt a non-empty string or message list) with errors naming that file; or, with
    ``env.hub_dataset`` set, the rows of that hub data set's ``split`` (default ``env.split``), checked the same way."""
    if env.hub_dataset:
        rows = load_hub_records(env.hub_dataset, env.hub_config, split or env.split)
        _check_rows(rows, env.prompt_column, env.ground_truth_column, f"env.hub_dataset={env.hub_dataset}")
        return rows
    records: list[dict] = []
    for path in file_paths(env.path):
        rows = load_records("file", path=path)
        _check_rows(rows, env.prompt_column, env.ground_truth_column, f"env.path={path}")
        records.extend(rows)
    return records


def passed_columns(
    records: Sequence[dict], prompt_column: str, ground_truth_column: str | None, extra_columns: Sequence[str] | None
) -> tuple[str, ...]:
    """The columns passed to the reward as keywords: every column but the ground truth, or the prompt column
    and ``extra_columns``. A column missing from some rows is passed as None for them."""
    present = list(dict.fromkeys(k for row in records for k in row))
    if extra_columns is None:
        return tuple(c for c in present if c != ground_truth_column)
    missing = [c for c in extra_columns if c not in present]
    if missing:
        raise ConfigError(f"env.extra_columns={list(extra_columns)}: no row has {missing}; columns: {present}")
    return tuple(dict.fromkeys([prompt_column, *extra_columns]))


def file_reward(env: EnvConfig, reward: RewardConfig, tokenizer) -> list[RewardComponent]:
    """None of its own: a user's task is scored by the user's reward functions (and a reward model), which every
    task can add."""
    return []


def file_system_prompt(env: EnvConfig, reward: RewardConfig) -> None:
    """None of its own: ``env.system_prompt``, when set, goes before rows that bring no system message."""
    return None


def make_file_env(
    env: EnvConfig,
    records: list[dict],
    tokenizer: Any,
    reward: CompositeReward,
    *,
    seed: int,
    system_prompt: str | None,
    tool_use: ToolUse | None = None,
) -> PromptEnv:
    """The environment over a user's rows (checked by :func:`load_file_records`): each row's prompt column after
    ``system_prompt``, its ground-truth column as the reference, and :func:`passed_columns` passed to the reward."""
    columns = passed_columns(
        records,
        env.prompt_column,
        env.ground_truth_column,
        None if env.extra_columns is None else list(env.extra_columns),
    )
    gt = env.ground_truth_column

    def reference_of(row: dict) -> Any:
        return row.get(gt) if gt else None

    return PromptEnv(
        records,
        tokenizer,
        reward,
        format_messages=partial(file_messages, prompt_column=env.prompt_column, system_prompt=system_prompt),
        reference_of=reference_of,
        prompts_per_step=env.prompts_per_step,
        max_prompt_tokens=env.max_prompt_tokens,
        seed=seed,
        shuffle=env.shuffle,
        too_long=env.too_long_prompts,
        extra_columns=columns,
        tool_use=tool_use,
        name=f"hub:{env.hub_dataset}" if env.hub_dataset else "file:" + ",".join(file_paths(env.path)),
    )
