"""What the entry scripts share around Hydra: overrides checked against the schema, user errors in one line.

* :func:`check_overrides` rejects a key the schema does not have before Hydra composes the config. Hydra's own
  hint for an unknown key is to add it with ``+``, and a ``+key`` is then silently accepted and ignored; here
  both forms end with the key, its nearest valid names and where every key is documented.
* :func:`check_output_dir_override` refuses an ``output_dir`` that is a file, before Hydra tries to make the folder.
* :func:`hydra_run_dir` is the run folder: ``output_dir``, or the folder Hydra made for the job.
* :func:`user_errors` turns a :class:`~grpo_rl.errors.UserError` raised by the run into one line on stderr and
  exit status 2; any other exception keeps its traceback. An error in the command line itself (a value Hydra
  cannot convert, say) also exits with 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.errors import ConfigError, RoleFailed, UserError

log = logging.getLogger(__name__)

USER_ERROR_EXIT = 2


def hydra_run_dir(cfg) -> Path:
    """``cfg.output_dir`` (with the job number appended in a sweep) if set, else the folder Hydra made for this job
    (outputs/DATE/TIME, or multirun/DATE/TIME/N in a sweep)."""
    if cfg.output_dir:
        base = Path(cfg.output_dir).expanduser().resolve()
        job = _multirun_job_number()
        return base / str(job) if job is not None else base  # so that a sweep's jobs never share a folder
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def _multirun_job_number() -> int | None:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
    except (ImportError, ValueError):  # not running under Hydra
        return None
    return int(hydra_cfg.job.num) if hydra_cfg.mode == RunMode.MULTIRUN else None


def schema_keys(schema: type = GRPOConfig) -> tuple[set[str], set[str], set[str]]:
    """The dotted keys of ``schema``: (every key, the keys whose children are free-form such as dicts, the
    groups)."""
    keys: set[str] = set()
    open_keys: set[str] = set()
    groups: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            keys.add(key)
            kind = hints[f.name]
            origin = typing.get_origin(kind)
            if dataclasses.is_dataclass(kind):
                groups.add(key)
                walk(kind, f"{key}.")
            elif origin in (dict, list) or kind is Any:
                open_keys.add(key)

    walk(schema, "")
    return keys, open_keys, groups


CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
"""The scripts' Hydra config folder; its subfolders are option groups (``+preset=lowmem``)."""


def config_groups(config_dir: Path = CONFIG_DIR) -> dict[str, list[str]]:
    """The option groups of ``config_dir``: each subfolder's name and its options (the YAML files in it)."""
    if not config_dir.is_dir():
        return {}
    return {d.name: sorted(f.stem for f in d.glob("*.yaml")) for d in config_dir.iterdir() if d.is_dir()}


def parse_overrides(argv: list[str]) -> list:
    """The command line's overrides as Hydra parses them; none when Hydra cannot parse them (it then reports its
    own syntax error, with exit status 2: see :func:`run_entry`)."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args, _ = get_args_parser().parse_known_args(argv)
    try:
        return OverridesParser.create().parse_overrides(args.overrides)
    except Exception:  # noqa: BLE001 - Hydra's own message follows
        return []


def check_overrides(argv: list[str], schema: type = GRPOConfig) -> None:
    """Raise :class:`ConfigError` for a command-line override whose key the schema does not have, or an option
    group (``+preset=NAME``) that has no such option."""
    keys, open_keys, groups = schema_keys(schema)
    options = config_groups()
    for override in parse_overrides(argv):
        key = override.key_or_group
        if override.is_hydra_override() or key in keys:
            continue
        if key in options:
            value = override.value()
            if isinstance(value, str) and value not in options[key]:
                raise ConfigError(
                    f"{override.input_line!r}: there is no {key} {value!r}; the {key}s are "
                    f"{', '.join(options[key])} (config/{key}/)"
                )
            continue
        if any(key.startswith(f"{k}.") or key.startswith(f"{k}[") for k in open_keys):
            continue
        close = difflib.get_close_matches(key, sorted(keys - groups), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ConfigError(
            f"unknown setting {override.input_line!r}: the config has no key {key!r}{hint} Every key "
            f"is listed with its meaning in grpo_rl/config/schema.py (python {sys.argv[0]} --cfg job prints "
            "the whole config)"
        )


def check_output_dir_override(argv: list[str]) -> None:
    """Raise :class:`~grpo_rl.errors.RunFolderError` when the command line's ``output_dir`` is a file (or lies in
    one), before Hydra makes that folder and ends in a ``FileExistsError`` traceback."""
    from grpo_rl.run.lifecycle import check_output_dir

    for override in parse_overrides(argv):
        if override.key_or_group == "output_dir" and not override.is_sweep_override():
            value = override.value()
            if isinstance(value, str) and value:
                check_output_dir(Path(value))


def report_user_error(error: UserError) -> None:
    """Print ``error`` as the one line a user acts on (no traceback)."""
    logging.shutdown()  # flush the run's log handlers first, so the error is the last thing printed
    print(f"error: {error}", file=sys.stderr, flush=True)


_task_started = False


def user_errors(task: Callable) -> Callable:
    """Decorate a Hydra task function: a :class:`UserError` exits with status 2 and one message."""

    @functools.wraps(task)
    def wrapped(cfg):
        global _task_started
        _task_started = True
        try:
            return task(cfg)
        except UserError as e:
            report_user_error(e)
            sys.exit(USER_ERROR_EXIT)
        except RoleFailed as e:  # the role's own traceback is in its log above; the driver's adds nothing
            report_user_error(e)
            sys.exit(1)

    return wrapped


def run_entry(hydra_main: Callable) -> None:
    """Run a script's ``@hydra.main`` function (whose task is decorated with :func:`user_errors`): check the
    overrides and the ``output_dir`` they give first; a command line that Hydra rejects exits with 2 as well."""
    try:
        check_overrides(sys.argv[1:])
        check_output_dir_override(sys.argv[1:])
    except UserError as e:
        report_user_error(e)
        sys.exit(USER_ERROR_EXIT)
    try:
        hydra_main()
    except SystemExit as e:
        # Hydra prints its own message for a command line it cannot compose and exits with 1; that is the
        # user's input, not a crash of the run.
        if e.code == 1 and not _task_started:
            sys.exit(USER_ERROR_EXIT)
        raise
