"""TorchRL's GRPO knobs, mapped onto this project's settings in one place.

TorchRL's GRPO scripts (pytorch/rl ``sota-implementations/grpo``: ``grpo-sync.py``, ``grpo-async.py`` and their
README) size a run with three keys that have no key of the same name here. Each is accepted, defaults to null (not
set), and when set decides the setting it maps to:

=============================  ===========================================  =========================================
TorchRL key                    its meaning there                            sets here
=============================  ===========================================  =========================================
``env.num_envs``               environments stepped in parallel: the        ``env.prompts_per_step =
                               answers generated together (one vLLM batch)  num_envs / env.group_size``
``train.total_dialog_turns``   dialog turns the run collects                ``train.steps = total_dialog_turns /
                                                                            (env.prompts_per_step x env.group_size)``
``train.optim_batch_size``     answers of one optimizer step, split into    ``train.micro_batch_tokens =
                               ``gradient_accumulation_steps``              optim_batch_size x`` the longest answer's
                               micro-batches; the README's lever against    tokens (prompt + answer)
                               out-of-memory errors in training
=============================  ===========================================  =========================================

Departures, each also in the key's documentation in :mod:`grpo_rl.config.schema`:

* ``env.num_envs``: here the answers generated together are also the step's training batch (TorchRL fills its
  training batches separately), and they must be whole groups.
* ``train.total_dialog_turns``: answers are counted as trained (``train.steps`` batches of
  ``env.prompts_per_step x env.group_size``), as ``grpo-sync.py`` collects them; a multi-turn episode counts once
  (TorchRL counts each turn); extra batches drawn by ``policy.dynamic_sampling`` and batches the asynchronous loop
  drops as stale are not counted; and the total must be a whole number of steps.
* ``train.optim_batch_size``: one optimizer step here always covers the whole batch, so only the micro-batch is
  set, and in tokens: the budget of ``optim_batch_size`` answers of the longest possible length. A micro-batch
  then never holds more tokens than that many answers padded to that length, and holds more answers when they are
  shorter. TorchRL's micro-batch is ``optim_batch_size / gradient_accumulation_steps`` answers: give that quotient
  here for a micro-batch of the same size.

A mapped setting given on the command line (or in the Python API's overrides) with another value than the one the
TorchRL key gives is an error naming both; a value from a YAML file is replaced, as ``train.prompt_epochs``
replaces ``train.steps``. :func:`describe_torchrl_keys` gives the start-up log's line for each key set.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import Any

from grpo_rl.errors import ConfigError


def override_keys(overrides: Iterable[str]) -> set[str]:
    """The dotted keys that Hydra overrides (``train.steps=50``, ``+key=v``, ``~key``) set."""
    return {str(o).split("=", 1)[0].lstrip("+~") for o in overrides}


def command_line_keys() -> set[str]:
    """The keys of the running Hydra app's command line (a script's overrides, for each job of a ``--multirun``);
    none outside a Hydra app (the Python API passes its overrides to :func:`resolve_torchrl_keys` itself)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    return override_keys(HydraConfig.get().overrides.task)


def resolve_torchrl_keys(cfg: Any, given: Collection[str] | None = None) -> None:
    """Set what each TorchRL key that is set maps to (the module's table), in place; calling it again is harmless.
    :func:`grpo_rl.run.setup.make_run` and :func:`grpo_rl.api.compose` call it; the checks only verify.

    Args:
        given: the keys set explicitly (an override); a mapped setting among them must agree with its TorchRL key.
            None: :func:`command_line_keys`.

    Raises:
        ConfigError: a TorchRL key below 1 or that does not divide into whole prompts or steps, or one that
            disagrees with a setting given explicitly, naming both keys and the fix.
    """
    given = command_line_keys() if given is None else set(given)
    for key, value, source, why in torchrl_settings(cfg):  # each is set before the next is worked out
        _set(cfg, key, value, given, source, why)


def check_torchrl_keys(cfg: Any) -> None:
    """Check, writing nothing, that the config holds what each TorchRL key that is set maps to.

    Raises:
        ConfigError: a TorchRL key that cannot be mapped (as :func:`resolve_torchrl_keys`), or a mapped setting
            the config holds with another value (the config was not derived: :func:`resolve_torchrl_keys`).
    """
    for key, value, source, why in torchrl_settings(cfg):
        group, name = key.split(".")
        current = getattr(getattr(cfg, group), name)
        if current != value:
            raise ConfigError(
                f"{source} gives {key}={value} ({why}), but the config holds {key}={current}: the "
                "TorchRL keys were not resolved (grpo_rl.config.torchrl_keys.resolve_torchrl_keys)"
            )


def torchrl_settings(cfg: Any) -> Iterator[tuple[str, int, str, str]]:
    """``(key, value, source, why)`` for each TorchRL key that is set (``source``: ``"env.num_envs=16"``), reading the
    config only; raises :class:`ConfigError`, naming the fix, for a key below 1 or not dividing into whole prompts or
    steps."""
    env, train = cfg.env, cfg.train
    if env.group_size < 1 or env.prompts_per_step < 1:
        return  # nothing to divide by: grpo_rl.config.checks names the bad setting
    prompts = env.prompts_per_step
    if env.num_envs is not None:
        n, g = _at_least_one("env.num_envs", env.num_envs), env.group_size
        if n % g:
            raise ConfigError(
                f"env.num_envs={n} is not a multiple of env.group_size={g}: it counts the answers "
                "generated together, here env.prompts_per_step prompts x env.group_size answers each; "
                f"use env.num_envs={_multiples(n, g)}, or an env.group_size that divides {n}"
            )
        prompts = n // g
        yield "env.prompts_per_step", prompts, f"env.num_envs={n}", f"{n} answers / env.group_size={g}"
    if train.total_dialog_turns is not None:
        total = _at_least_one("train.total_dialog_turns", train.total_dialog_turns)
        if train.prompt_epochs is not None:
            raise ConfigError(
                f"train.total_dialog_turns={total} and train.prompt_epochs={train.prompt_epochs:g} both "
                "set the run's length; keep one of them (the other null)"
            )
        per_step = prompts * env.group_size
        if total % per_step:
            raise ConfigError(
                f"train.total_dialog_turns={total} is not a whole number of steps of {per_step} answers "
                f"(env.prompts_per_step={prompts} x env.group_size={env.group_size}); use "
                f"train.total_dialog_turns={_multiples(total, per_step)}"
            )
        yield (
            "train.steps",
            total // per_step,
            f"train.total_dialog_turns={total}",
            f"{total} answers / {per_step} a step",
        )
    if train.optim_batch_size is not None:
        size = _at_least_one("train.optim_batch_size", train.optim_batch_size)
        if train.share_prompt and size < env.group_size:
            raise ConfigError(
                f"train.optim_batch_size={size} is less than env.group_size={env.group_size}: with "
                "train.share_prompt=true a micro-batch holds whole groups (their prompt runs once); set "
                f"train.optim_batch_size to {env.group_size} or more, or train.share_prompt=false"
            )
        width, _ = answer_tokens(cfg)
        yield (
            "train.micro_batch_tokens",
            size * width,
            f"train.optim_batch_size={size}",
            f"{size} answers x {width} tokens",
        )


def answer_tokens(cfg: Any) -> tuple[int, str]:
    """The most tokens (prompt + answer) one answer's row can take, and the settings that bound it."""
    if cfg.env.max_turns > 1:  # an episode's turns and tool replies stop at the engine's context
        return cfg.inference_model.max_model_len, f"inference_model.max_model_len, env.max_turns={cfg.env.max_turns}"
    prompt, answer = cfg.env.max_prompt_tokens, cfg.sampling.max_new_tokens
    return prompt + answer, f"env.max_prompt_tokens={prompt} + sampling.max_new_tokens={answer}"


def describe_torchrl_keys(cfg: Any) -> list[str]:
    """One line for each TorchRL key set, saying what it became (after :func:`resolve_torchrl_keys`)."""
    env, train = cfg.env, cfg.train
    lines = []
    if env.num_envs is not None:
        lines.append(
            f"env.num_envs={env.num_envs} -> env.prompts_per_step={env.prompts_per_step} "
            f"({env.num_envs} answers generated together, env.group_size={env.group_size} per prompt)"
        )
    if train.total_dialog_turns is not None:
        lines.append(
            f"train.total_dialog_turns={train.total_dialog_turns} -> train.steps={train.steps} "
            f"({train.total_dialog_turns} answers, {env.prompts_per_step} prompts x {env.group_size} a step)"
        )
    if train.optim_batch_size is not None:
        width, why = answer_tokens(cfg)
        lines.append(
            f"train.optim_batch_size={train.optim_batch_size} -> train.micro_batch_tokens="
            f"{train.micro_batch_tokens} (answers of up to {width} tokens, {why})"
        )
    return lines


def _at_least_one(key: str, value: int) -> int:
    if value < 1:
        raise ConfigError(f"{key}={value} must be >= 1, or null to leave it unset")
    return int(value)


def _multiples(value: int, unit: int) -> str:
    """The multiples of ``unit`` nearest ``value``, for a message: ``'24 or 32'``, or ``'8'`` below the first."""
    below = value // unit * unit
    return f"{below} or {below + unit}" if below else f"{unit}"


def _set(cfg: Any, key: str, value: int, given: Collection[str], source: str, why: str) -> None:
    """Set ``key`` to ``value`` (what ``source``, a TorchRL key, maps to, for the reason ``why``) unless it was given
    otherwise."""
    group, name = key.split(".")
    current = getattr(getattr(cfg, group), name)
    if current != value and key in given:
        raise ConfigError(
            f"{source} gives {key}={value} ({why}), but {key}={current} is given too; drop one of them, "
            "or make them agree"
        )
    setattr(getattr(cfg, group), name, value)
