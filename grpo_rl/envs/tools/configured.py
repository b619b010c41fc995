"""The tools ``env.tools`` names: built-in ones by name, a user's functions by file and name, each with its
``timeout_seconds``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from grpo_rl.envs.tools.registry import BUILTIN_TOOLS, Tool, load_tool
from grpo_rl.errors import ConfigError


def _timeout(spec: Any, key: str) -> float | None:
    """``spec.timeout_seconds`` as a float (None: no limit); raises when it is not > 0."""
    timeout = spec.timeout_seconds
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(
            f"{key}.timeout_seconds={timeout} must be > 0 (seconds one call of the tool may take), or null for no limit"
        )
    return None if timeout is None else float(timeout)


def configured_tools(specs: Sequence[Any]) -> dict[str, Tool]:
    """``env.tools`` entries (``name``, optional ``path`` and ``timeout_seconds``) as tools by name, in order.

    Raises:
        ConfigError: an unknown built-in, a tool file or function that cannot be loaded, a ``timeout_seconds``
            that is not > 0, or two tools of one name.
    """
    tools: dict[str, Tool] = {}
    for i, spec in enumerate(specs):
        key = f"env.tools[{i}]"
        timeout = _timeout(spec, key)
        if spec.path:
            tool = load_tool(spec.path, spec.name, key=key)
        elif spec.name in BUILTIN_TOOLS:
            tool = BUILTIN_TOOLS[spec.name]
        else:
            raise ConfigError(
                f"{key}.name={spec.name}: no built-in tool of that name (built-in: "
                f"{', '.join(sorted(BUILTIN_TOOLS))}); for your own, set {key}.path to the Python file "
                "that defines it"
            )
        if tool.name in tools:
            raise ConfigError(f"{key}: a second tool named {tool.name!r}; tool names must be distinct")
        tools[tool.name] = dataclasses.replace(tool, timeout_seconds=timeout)
    return tools
