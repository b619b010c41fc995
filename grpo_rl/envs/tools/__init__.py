"""Tools for multi-turn, tool-using episodes: a safe calculator (:mod:`~grpo_rl.envs.tools.calculator`), the
Hermes tool-call format and its system prompt (:mod:`~grpo_rl.envs.tools.format`), and user tools loaded from Python
files with a guarded call (:mod:`~grpo_rl.envs.tools.registry`). Nothing here imports torch."""

from __future__ import annotations

from grpo_rl.envs.tools.calculator import CalculatorError, calculator, evaluate
from grpo_rl.envs.tools.format import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolCall,
    ToolCallError,
    format_tool_call,
    parse_tool_call,
    tool_system_prompt,
)
from grpo_rl.envs.tools.registry import BUILTIN_TOOLS, Tool, ToolError, call_tool, load_tool, tool_from_function

__all__ = [
    "BUILTIN_TOOLS",
    "CalculatorError",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolError",
    "calculator",
    "call_tool",
    "evaluate",
    "format_tool_call",
    "load_tool",
    "parse_tool_call",
    "tool_from_function",
    "tool_system_prompt",
]
