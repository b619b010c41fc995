"""Importing a user's Python file (reward functions, tools) once per process, with errors that name the setting.

A file is imported under a module name derived from its path, registered in ``sys.modules`` while it runs (so
dataclasses and pickling inside it find their module) and cached by path and modification time, so validating the
config and building the environments import it once, and an edited file is imported again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from grpo_rl.errors import ConfigError

_MODULES: dict[tuple[str, float], ModuleType] = {}


def import_user_file(
    path: str,
    key: str,
    *,
    what: str = "reward function",
    error: type[ConfigError] = ConfigError,
    docs: str = "see docs/custom_tasks.md",
) -> ModuleType:
    """Import the Python file ``path`` named by the setting ``key``; ``what`` it should define, for messages.

    Raises:
        ``error`` (a :class:`ConfigError`): the file is missing, not a ``.py`` file, or fails to import (a top-level
            ``sys.exit()`` included).
    """
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        state = "is a directory" if file.is_dir() else "does not exist"
        raise error(
            f"{key}={path}: {file} {state}; set {key} to the Python file that defines your {what} (an "
            f"absolute path, or relative to where you run the script; {docs})"
        )
    if file.suffix != ".py":
        raise error(f"{key}={path}: expected a Python source file (.py)")
    cache_key = (str(file), file.stat().st_mtime)
    if cache_key in _MODULES:
        return _MODULES[cache_key]
    module_name = f"grpo_rl_user_file_{hashlib.sha1(str(file).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # a top-level sys.exit() must not end the run without a word
        sys.modules.pop(module_name, None)
        happened = "called sys.exit()" if isinstance(e, SystemExit) else f"raised {type(e).__name__}: {e}"
        raise error(f"{key}={path}: importing the file {happened}; fix the file's top-level code") from e
    _MODULES[cache_key] = module
    return module


def user_function(
    path: str,
    name: str,
    key: str,
    *,
    what: str = "reward function",
    error: type[ConfigError] = ConfigError,
    docs: str = "see docs/custom_tasks.md",
) -> Any:
    """The object ``name`` defined (or imported) at the top level of the file ``path``, which the settings
    ``{key}.path`` and ``{key}.name`` give; the caller checks that it is the function it needs.

    Raises:
        ``error``: the file cannot be imported (:func:`import_user_file`), or it defines no ``name`` (the message
            lists the functions it does define).
    """
    module = import_user_file(path, f"{key}.path", what=what, error=error, docs=docs)
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(
            n
            for n, v in vars(module).items()
            if inspect.isfunction(v) and v.__module__ == module.__name__ and not n.startswith("_")
        )
        raise error(
            f"{key}.name={name}: {path} defines no {name!r}; functions it defines: {defined or 'none'}. "
            f"Set {key}.name to one of them ({docs})"
        )
    return fn
