"""The tool-call format of tool-using episodes: how the model calls a tool, and the system prompt that says so.

The format is the Hermes convention that Qwen2.5/Qwen3 chat templates, vLLM's ``hermes`` tool parser and most
open tool-use data use. The model writes one JSON object between tags::

    <tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>

and the tool's reply goes back as a message with role ``tool``. :func:`parse_tool_call` reads the first complete
call in a model's turn; :attr:`ToolCall.end` is the offset just past its closing tag, where the environment cuts
the turn (anything the model wrote after it, such as an imagined result, is dropped).

Leniency. ``arguments`` may also be a JSON *string* holding the object (``"arguments": "{\\"expression\\":
\\"12*7\\"}"``): that is OpenAI's function-calling format, common in the data small instruct models were tuned
on. A missing ``arguments`` means no arguments (a tool without parameters). A bare string
(``"arguments": "12*7"``) is refused as malformed, with a message showing the right form: the parser knows no
tool's parameters, and under RL anything the parser accepts is reinforced, so guessing which parameter a bare
string was meant for would train the model away from the declared format. Keys other than ``name`` and
``arguments`` are ignored.

An engine stopping at ``</tool_call>`` usually leaves the stop string out of the text; append
:data:`TOOL_CALL_CLOSE` before parsing (or sample with ``include_stop_str_in_output``), otherwise the call is
``unclosed``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ToolCall",
    "ToolCallError",
    "format_tool_call",
    "parse_tool_call",
    "tool_system_prompt",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_EXAMPLE_CALL = '{"name": "calculator", "arguments": {"expression": "12*7"}}'


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool's ``name``, its ``arguments`` (JSON values by parameter name) and ``end``, the
    offset in the parsed text just past the closing tag."""

    name: str
    arguments: dict[str, Any]
    end: int


@dataclass(frozen=True)
class ToolCallError:
    """A call the model opened but did not write correctly (returned, not raised)."""

    kind: str  # "malformed" (not JSON, not an object, no string name, arguments not an object) or "unclosed"
    message: str  # one line for the model's tool message, starting with "error:"
    end: int  # where to cut the turn: just past the closing tag, or the end of the text when there is none


def _malformed(detail: str, end: int) -> ToolCallError:
    return ToolCallError(
        "malformed",
        f"error: malformed tool call: {detail}; write {TOOL_CALL_OPEN}{_EXAMPLE_CALL}{TOOL_CALL_CLOSE}",
        end,
    )


def parse_tool_call(text: str) -> ToolCall | ToolCallError | None:
    """The first tool call in ``text``: None when ``text`` has no :data:`TOOL_CALL_OPEN`, a :class:`ToolCall`
    when the first opened call is well formed, else a :class:`ToolCallError`. Later calls are ignored."""
    start = text.find(TOOL_CALL_OPEN)
    if start < 0:
        return None
    body_start = start + len(TOOL_CALL_OPEN)
    close = text.find(TOOL_CALL_CLOSE, body_start)
    if close < 0:
        return ToolCallError("unclosed", f"error: tool call not closed; end it with {TOOL_CALL_CLOSE}", len(text))
    end = close + len(TOOL_CALL_CLOSE)
    body = text[body_start:close].strip()
    try:
        call = json.loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError; RecursionError: deep nesting
        detail = e.msg if isinstance(e, json.JSONDecodeError) else type(e).__name__
        return _malformed(f"not valid JSON ({detail})", end)
    if not isinstance(call, dict):
        return _malformed("expected a JSON object", end)
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return _malformed('no "name"', end)
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI's format: the arguments object encoded as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            arguments = None
        if not isinstance(arguments, dict):
            return _malformed('"arguments" must be an object of named values', end)
    if not isinstance(arguments, dict):
        return _malformed('"arguments" must be an object of named values', end)
    return ToolCall(name, arguments, end)


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The text of a call, as the model should write it."""
    return f"{TOOL_CALL_OPEN}{json.dumps({'name': name, 'arguments': dict(arguments)})}{TOOL_CALL_CLOSE}"


class ToolSpec(Protocol):
    """What the system prompt needs of a tool (:class:`grpo_rl.envs.tools.registry.Tool` has it)."""

    name: str
    description: str
    parameters: Mapping[str, str]


def tool_system_prompt(tools: Sequence[ToolSpec]) -> str:
    """A short system-prompt paragraph for small models: the tools, one line each, and the call format with one
    example call of the first tool (its ``example`` arguments, else ``"..."`` for each parameter)."""
    if not tools:
        raise ValueError("tool_system_prompt needs at least one tool")
    lines = ["You can use these tools:"]
    for tool in tools:
        description = tool.description.strip()
        description += "" if description.endswith((".", "!", "?")) else "."
        params = "; ".join(f"{p}: {d.strip().rstrip('.')}" if d else p for p, d in tool.parameters.items())
        lines.append(f"- {tool.name}: {description}" + (f" Arguments: {params}." if params else ""))
    first = tools[0]
    example = getattr(first, "example", None) or {p: "..." for p in first.parameters}
    lines += [
        "To use a tool, write exactly:",
        format_tool_call(first.name, example),
        "then stop. The result comes back in a tool message. Call one tool at a time.",
    ]
    return "\n".join(lines)
