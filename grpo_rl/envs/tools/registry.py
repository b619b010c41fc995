"""Tools for tool-using episodes: the built-in calculator, a user's tools loaded from Python files, and the guarded
call the environment makes for each :class:`~grpo_rl.envs.tools.format.ToolCall`.

A user's tool is a plain function in a Python file, registered by path and name as reward functions are
(``env.tools: [{path: my_tools.py, name: lookup}]``)::

    def lookup(city: str, units: str = "metric") -> str:
        \"\"\"Current weather in a city.

        Args:
            city: the city's name, e.g. "Paris".
            units: "metric" or "imperial".
        \"\"\"

The first line of the docstring is the description the model reads; the parameters are the signature's, each
described by its ``Args:`` line (else its annotation) and marked optional when it has a default. Arguments
arrive by name exactly as the model wrote them in JSON (str, int, float, bool, None, list, dict): annotations
are shown to the model but not enforced or converted, so a tool should check what it gets. A tool returns text
(anything else but None goes through ``str()``), or raises :class:`ToolError` for an error the model should read.

:func:`call_tool` never raises: wrong argument names, an exception inside the tool, a reply that is no text (None,
an object whose ``str()`` fails, text that is not valid Unicode), a call past the tool's ``timeout_seconds`` and
oversized output all become the text of the ``tool`` message, with an error kind the environment can count. The
time limit is the one reward functions have (:mod:`grpo_rl.envs.time_limit`): the call runs in a worker thread, and
one that does not return in time is abandoned (it runs on in the background); a tool with
:data:`~grpo_rl.envs.time_limit.MAX_ABANDONED_CALLS` such calls still running is not called until they return.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_rl.envs.time_limit import MAX_ABANDONED_CALLS, CallTimeout, call_with_time_limit, still_running
from grpo_rl.envs.tools.calculator import CalculatorError, evaluate, format_number
from grpo_rl.envs.user_files import user_function
from grpo_rl.errors import ConfigError

__all__ = [
    "BUILTIN_TOOLS",
    "MAX_ERROR_CHARS",
    "MAX_OUTPUT_CHARS",
    "Tool",
    "ToolError",
    "ToolTimeout",
    "call_tool",
    "load_tool",
    "tool_from_function",
]

log = logging.getLogger(__name__)

# Longest tool reply (the tool message's text) by default, and longest error line.
MAX_OUTPUT_CHARS = 500
MAX_ERROR_CHARS = 200


@dataclass(frozen=True)
class Tool:
    """A tool the model can call.

    Attributes:
        name: what the model writes in ``"name"``.
        description: one line for the system prompt.
        parameters: parameter name -> one-line description, in signature order.
        fn: called with the arguments by name; returns the reply text (or anything ``str()`` turns into it).
        example: arguments for the system prompt's example call (default: ``"..."`` for each parameter).
        timeout_seconds: how long one call may run before it is abandoned and answered with an error (None: no
            limit; ``env.tools[i].timeout_seconds`` for configured tools).
    """

    name: str
    description: str
    parameters: dict[str, str]
    fn: Callable[..., Any] = field(repr=False)
    example: dict[str, Any] | None = None
    timeout_seconds: float | None = None


class ToolError(Exception):
    """Raised by a tool for an error the model should read: the reply is ``error: <message>`` (no exception type)
    and the call is counted under ``kind``."""

    def __init__(self, message: str, kind: str = "tool_error"):
        super().__init__(message)
        self.kind = kind


class ToolTimeout(CallTimeout):
    """A tool call ran past its tool's ``timeout_seconds`` and was abandoned (or was not made)."""


class _BadOutput(Exception):
    """A tool returned something that is not a reply: None, an object whose ``str()`` fails, text that is not
    valid Unicode."""


def _args_section(doc: str) -> dict[str, str]:
    """``{name: first line of its description}`` from a Google-style ``Args:`` section."""
    out: dict[str, str] = {}
    indent: int | None = None
    in_args = False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args, indent = True, None
            continue
        if not in_args or not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent:
            break
        match = re.match(r"(\w+)\s*(?:\(.*?\))?\s*:\s*(.*)$", stripped)
        if depth == indent and match:
            out[match.group(1)] = match.group(2)
    return out


def _describe_parameter(param: inspect.Parameter, documented: str | None) -> str:
    text = (documented or "").rstrip(".")
    if not text and param.annotation is not inspect.Parameter.empty:
        annotation = param.annotation
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    if param.default is not inspect.Parameter.empty:
        text = f"{text} (optional)" if text else "optional"
    return text


def tool_from_function(fn: Callable[..., Any], *, name: str | None = None, key: str = "tools", where: str = "") -> Tool:
    """A :class:`Tool` from a function: its description from the docstring's first line, its parameters from the
    signature, and the arguments of the system prompt's example call from an ``example`` attribute, if it has one
    (``calculator.example = {"expression": "12*7"}``).

    Args:
        fn: the function (or any callable).
        name: the tool's name; default: the function's ``__name__``.
        key: config key for error messages, e.g. ``"env.tools[1]"``.
        where: `` in <file>`` for error messages.

    Raises:
        ConfigError: no docstring, an unreadable signature, a parameter that cannot be passed by name
            (``*args``, ``**kwargs``, positional-only), or an ``example`` that is not a dict of its parameters.
    """
    name = name or getattr(fn, "__name__", type(fn).__name__)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{key}.name={name}: cannot read the signature of {name!r}{where} ({e}); wrap it in a "
            "def with named parameters"
        ) from e
    for p in signature.parameters.values():
        fix = None
        if p.kind is p.VAR_POSITIONAL:
            fix = f"takes *{p.name}; the model passes arguments by name, so give each one its own parameter"
        elif p.kind is p.VAR_KEYWORD:
            fix = f"takes **{p.name}; name each parameter, as the model is shown the parameter names"
        elif p.kind is p.POSITIONAL_ONLY:
            fix = f"has positional-only parameter {p.name!r}; the model passes arguments by name, so remove the /"
        if fix:
            raise ConfigError(f"{key}.name={name}: {name}{signature}{where} {fix}")
    doc = inspect.getdoc(fn) or ""
    first = next((line.strip() for line in doc.splitlines() if line.strip()), "")
    if not first:
        raise ConfigError(
            f"{key}.name={name}: {name!r}{where} has no docstring; add one whose first line says what "
            "the tool does (the model reads it as the tool's description)"
        )
    documented = _args_section(doc)
    parameters = {p.name: _describe_parameter(p, documented.get(p.name)) for p in signature.parameters.values()}
    example = getattr(fn, "example", None)
    if example is not None and (not isinstance(example, Mapping) or not set(example) <= set(parameters)):
        raise ConfigError(
            f"{key}.name={name}: {name}.example{where} must be a dict of its arguments for the system "
            f"prompt's example call (of {', '.join(parameters) or 'no arguments'}), not {example!r}"
        )
    return Tool(
        name=name,
        description=first,
        parameters=parameters,
        fn=fn,
        example=dict(example) if example is not None else None,
    )


def load_tool(path: str, name: str, *, key: str = "env.tools") -> Tool:
    """Import ``path`` (once per process, shared with reward files) and make a :class:`Tool` of its top-level
    function ``name``; ``key`` (``env.tools[i]``) names it in errors.

    Raises:
        ConfigError: the file is missing, not ``.py`` or fails to import; ``name`` is missing or not callable;
            or see :func:`tool_from_function`.
    """
    fn = user_function(path, name, key, what="tool function", docs="see docs/custom_tasks.md")
    if not callable(fn):
        raise ConfigError(
            f"{key}.name={name}: {name!r} in {path} is not a function (it is of type "
            f"{type(fn).__name__}); set {key}.name to a function's name"
        )
    return tool_from_function(fn, name=name, key=key, where=f" in {path}")


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reply_text(tool: Tool, arguments: Mapping[str, Any]) -> str:
    """``tool``'s reply to ``arguments`` as text; raises :class:`_BadOutput` when it is no text."""
    out = tool.fn(**arguments)
    if out is None:
        raise _BadOutput(f"{tool.name} returned None, not a reply; a tool returns its reply as text")
    try:
        text = out if isinstance(out, str) else str(out)
    except Exception as e:  # noqa: BLE001 - a user's object whose __str__ fails
        raise _BadOutput(f"{tool.name} returned a {type(out).__name__} whose str() raised {type(e).__name__}") from e
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates: no tokenizer can encode them
        raise _BadOutput(f"{tool.name} returned text that is not valid Unicode (at character {e.start})") from e
    return text


def call_tool(
    tool: Tool, arguments: Any, *, max_chars: int = MAX_OUTPUT_CHARS, abandoned: list[threading.Thread] | None = None
) -> tuple[str, str | None]:
    """Run ``tool`` with ``arguments`` (a :class:`~grpo_rl.envs.tools.format.ToolCall`'s) under its
    ``timeout_seconds``, and never raise.

    Args:
        tool: the tool.
        arguments: the call's arguments, as the model wrote them.
        max_chars: a reply longer than this is cut, ending with how long it was.
        abandoned: this tool's calls that ran past the limit and may still run, kept by the caller across calls: a
            call that times out is added; with :data:`~grpo_rl.envs.time_limit.MAX_ABANDONED_CALLS` of them still
            running the tool is not called. None: no such bound.

    Returns:
        ``(text, kind)``: the ``tool`` message's text and None, or an ``error: ...`` line and the error's kind:
        ``"bad_arguments"`` (not an object, an unknown or a missing argument), ``"exception"`` (the tool raised;
        the line gives the exception's type and message, cut to :data:`MAX_ERROR_CHARS`), ``"timeout"`` (it ran
        past ``timeout_seconds``, or was not called because earlier calls still run), ``"bad_output"`` (the reply
        is no text), a :class:`ToolError`'s ``kind``, or the calculator's
        (:data:`grpo_rl.envs.tools.calculator.KINDS`).
    """
    if not isinstance(arguments, Mapping):
        return _one_line(
            f"error: {tool.name} takes an object of named arguments, not {type(arguments).__name__}", MAX_ERROR_CHARS
        ), "bad_arguments"
    known = ", ".join(tool.parameters) or "none"
    unknown = [a for a in arguments if a not in tool.parameters]
    if unknown:
        return _one_line(
            f"error: {tool.name} has no argument {str(unknown[0])!r}; its arguments: {known}", MAX_ERROR_CHARS
        ), "bad_arguments"
    try:
        inspect.signature(tool.fn).bind(**arguments)
    except TypeError as e:  # a missing required argument
        return _one_line(f"error: {e}; {tool.name}'s arguments: {known}", MAX_ERROR_CHARS), "bad_arguments"
    except ValueError:  # no readable signature: the call itself will tell
        pass
    limit = tool.timeout_seconds
    if abandoned is not None and still_running(abandoned) >= MAX_ABANDONED_CALLS:
        return _one_line(
            f"error: {tool.name} was not called: {len(abandoned)} earlier calls are still running past "
            f"its time limit of {limit:g} s",
            MAX_ERROR_CHARS,
        ), "timeout"
    call = functools.partial(_reply_text, tool, arguments)
    try:
        if limit is None:
            text = call()
        else:
            text = call_with_time_limit(
                call,
                limit,
                name=f"tool-{tool.name}",
                error=ToolTimeout,
                message=f"{tool.name} did not answer within {limit:g} s",
            )
    except ToolTimeout as e:
        if abandoned is not None and e.thread is not None:
            abandoned.append(e.thread)
        log.warning(
            "tool %r ran past its timeout_seconds=%g (env.tools) and was abandoned; the model gets an error "
            "reply (counted in tool_errors_timeout)",
            tool.name,
            limit,
        )
        return _one_line(f"error: {e}", MAX_ERROR_CHARS), "timeout"
    except (ToolError, CalculatorError) as e:
        return _one_line(f"error: {e}", MAX_ERROR_CHARS), e.kind
    except _BadOutput as e:
        return _one_line(f"error: {e}", MAX_ERROR_CHARS), "bad_output"
    except (Exception, SystemExit) as e:  # a tool's sys.exit() must not end the run
        return _one_line(f"error: {type(e).__name__}: {e}", MAX_ERROR_CHARS), "exception"
    if len(text) > max_chars:
        suffix = f"... ({len(text)} characters, cut)"
        text = text[: max(0, max_chars - len(suffix))] + suffix
    return text, None


def _calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: the arithmetic expression, e.g. "2*(3+4)".
    """
    return format_number(evaluate(expression))  # raises CalculatorError, which call_tool reports with its kind


BUILTIN_TOOLS: dict[str, Tool] = {
    "calculator": Tool(
        name="calculator",
        description="Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        parameters={"expression": 'the arithmetic expression, e.g. "2*(3+4)"'},
        fn=_calculator,
        example={"expression": "12*7"},
    ),
}
