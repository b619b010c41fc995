"""The tools ``env.tools`` names: built-in ones by name, a user's functions by file and name."""
from __future__ import annotations

from typing import Any, Sequence

from grpo_rl.errors import ConfigError
from grpo_rl.envs.tools.registry import BUILTIN_TOOLS, Tool, load_tool


def configured_tools(specs: Sequence[Any]) -> dict[str, Tool]:
    """``env.tools`` entries (``name`` and optional ``path``) as tools by name, in order.

    Raises:
        ConfigError: an unknown built-in, a tool file or function that cannot be loaded, or two tools of one name.
    """
    tools: dict[str, Tool] = {}
    for i, spec in enumerate(specs):
        key = f"env.tools[{i}]"
        if spec.path:
            tool = load_tool(spec.path, spec.name, key=key)
        elif spec.name in BUILTIN_TOOLS:
            tool = BUILTIN_TOOLS[spec.name]
        else:
            raise ConfigError(f"{key}.name={spec.name}: no built-in tool of that name (built-in: "
                              f"{', '.join(sorted(BUILTIN_TOOLS))}); for your own, set {key}.path to the Python file "
                              "that defines it")
        if tool.name in tools:
            raise ConfigError(f"{key}: a second tool named {tool.name!r}; tool names must be distinct")
        tools[tool.name] = tool
    return tools
