"""Tests for tools (grpo_rl.envs.tools.registry): a user's tool loaded from a file with its description and parameters,
the one-line errors that name the config key, and call_tool's capture of bad arguments, exceptions and long
output."""

from __future__ import annotations

import logging
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_rl.envs.time_limit import MAX_ABANDONED_CALLS
from grpo_rl.envs.tools.calculator import KINDS
from grpo_rl.envs.tools.configured import configured_tools
from grpo_rl.envs.tools.format import parse_tool_call
from grpo_rl.envs.tools.registry import (
    BUILTIN_TOOLS,
    MAX_ERROR_CHARS,
    Tool,
    ToolError,
    call_tool,
    load_tool,
    tool_from_function,
)
from grpo_rl.errors import ConfigError

TOOLS = '''
import sys

from grpo_rl.envs.tools.registry import ToolError


def weather(city: str, units: str = "metric") -> str:
    """Current weather in a city.

    Args:
        city: the city's name, e.g. "Paris".
            More about the city.
        units: "metric" or "imperial".
    """
    if city == "Atlantis":
        raise ToolError("unknown city", kind="not_found")
    return f"{city}: 21 C" if units == "metric" else f"{city}: 70 F"


def count(n: int, word):
    """Repeat a word."""
    return [word] * n


def broken(text):
    """Always fails."""
    raise KeyError("a very long message " * 30)


def exits():
    """Ends the process."""
    sys.exit(3)


def no_doc(x):
    return x


def star_args(*values):
    """Sum values."""
    return sum(values)


def star_kwargs(**values):
    """Echo values."""
    return values


def positional_only(x, /):
    """Echo."""
    return x


NOT_A_FUNCTION = 3
'''


@pytest.fixture
def tools_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_tools.py"
    path.write_text(textwrap.dedent(TOOLS))
    return path


# --------------------------------------------------------------------------- loading


def test_description_and_parameters_come_from_the_function(tools_file):
    tool = load_tool(str(tools_file), "weather", key="env.tools[0]")
    assert tool.name == "weather"
    assert tool.description == "Current weather in a city."
    assert tool.parameters == {"city": 'the city\'s name, e.g. "Paris"', "units": '"metric" or "imperial" (optional)'}
    assert call_tool(tool, {"city": "Paris"}) == ("Paris: 21 C", None)
    assert call_tool(tool, {"city": "Oslo", "units": "imperial"}) == ("Oslo: 70 F", None)


def test_parameters_without_docs_use_their_annotation(tools_file):
    tool = load_tool(str(tools_file), "count")
    assert tool.parameters == {"n": "int", "word": ""}
    assert call_tool(tool, {"n": 2, "word": "hi"}) == ("['hi', 'hi']", None)  # non-text output goes through str()


def test_a_tool_from_a_python_function():
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    tool = tool_from_function(shout)
    assert (tool.name, tool.description, tool.parameters) == ("shout", "Upper-case a text.", {"text": "str"})
    assert tool_from_function(shout, name="loud").name == "loud"


def test_a_tool_example_shows_in_the_system_prompt_and_is_checked():
    from grpo_rl.envs.tools.format import format_tool_call, tool_system_prompt

    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    assert format_tool_call("shout", {"text": "..."}) in tool_system_prompt([tool_from_function(shout)])
    shout.example = {"text": "hello"}
    assert format_tool_call("shout", {"text": "hello"}) in tool_system_prompt([tool_from_function(shout)])
    shout.example = {"words": "hello"}
    with pytest.raises(
        ConfigError,
        match=r"env\.tools\[0\]\.name=shout: shout\.example must be a dict of its "
        r"arguments .* \(of text\), not \{'words': 'hello'\}",
    ):
        tool_from_function(shout, key="env.tools[0]")


@pytest.mark.parametrize(
    "name, pattern",
    [
        ("no_doc", r"env\.tools\[2\]\.name=no_doc: 'no_doc' in .*my_tools\.py has no docstring; add one"),
        (
            "star_args",
            r"env\.tools\[2\]\.name=star_args: star_args\(\*values\) in .* takes \*values; "
            r".* its own parameter",
        ),
        ("star_kwargs", r"env\.tools\[2\]\.name=star_kwargs: .* takes \*\*values; name each parameter"),
        (
            "positional_only",
            r"env\.tools\[2\]\.name=positional_only: .* positional-only parameter 'x'; .* remove the /",
        ),
        (
            "missing",
            r"env\.tools\[2\]\.name=missing: .*my_tools\.py defines no 'missing'; functions it defines: "
            r"\['broken', 'count', .*\]\. Set env\.tools\[2\]\.name to one of them",
        ),
        (
            "NOT_A_FUNCTION",
            r"env\.tools\[2\]\.name=NOT_A_FUNCTION: 'NOT_A_FUNCTION' in .* is not a function "
            r"\(it is of type int\)",
        ),
    ],
)
def test_loading_errors_name_the_key_and_the_fix(tools_file, name, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        load_tool(str(tools_file), name, key="env.tools[2]")
    assert "\n" not in str(info.value)


def test_a_missing_file_or_a_directory(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"env\.tools\[0\]\.path=.*nope\.py does not exist; set env\.tools\[0\]"
        r"\.path to the Python file that defines your tool function",
    ):
        load_tool(str(tmp_path / "nope.py"), "f", key="env.tools[0]")
    with pytest.raises(ConfigError, match="is a directory"):
        load_tool(str(tmp_path), "f", key="env.tools[0]")


def test_a_file_that_fails_to_import(tmp_path):
    bad = tmp_path / "bad_tools.py"
    bad.write_text("raise RuntimeError('no network')\n")
    with pytest.raises(ConfigError, match=r"env\.tools\[1\]\.path=.*raised RuntimeError: no network"):
        load_tool(str(bad), "f", key="env.tools[1]")
    text = tmp_path / "tools.txt"
    text.write_text("def f():\n    'Doc.'\n")
    with pytest.raises(ConfigError, match=r"env\.tools\[1\]\.path=.*expected a Python source file"):
        load_tool(str(text), "f", key="env.tools[1]")


# --------------------------------------------------------------------------- call_tool


def test_unknown_and_missing_arguments(tools_file):
    tool = load_tool(str(tools_file), "weather")
    assert call_tool(tool, {"town": "Paris"}) == (
        "error: weather has no argument 'town'; its arguments: city, units",
        "bad_arguments",
    )
    text, kind = call_tool(tool, {"units": "metric"})
    assert kind == "bad_arguments" and "missing a required argument: 'city'" in text and text.startswith("error: ")
    assert call_tool(tool, ["Paris"]) == (
        "error: weather takes an object of named arguments, not list",
        "bad_arguments",
    )


def test_exceptions_inside_a_tool_are_captured(tools_file):
    text, kind = call_tool(load_tool(str(tools_file), "broken"), {"text": "x"})
    assert kind == "exception"
    assert text.startswith("error: KeyError: 'a very long message") and text.endswith("...")
    assert len(text) == MAX_ERROR_CHARS and "\n" not in text
    text, kind = call_tool(load_tool(str(tools_file), "exits"), {})
    assert (text, kind) == ("error: SystemExit: 3", "exception")


def test_a_tool_error_is_shown_without_its_type(tools_file):
    assert call_tool(load_tool(str(tools_file), "weather"), {"city": "Atlantis"}) == (
        "error: unknown city",
        "not_found",
    )
    tool = Tool("t", "Fails.", {}, fn=lambda: (_ for _ in ()).throw(ToolError("nope")))
    assert call_tool(tool, {}) == ("error: nope", "tool_error")


def test_long_output_is_cut(tools_file):
    tool = Tool("long", "Long output.", {"n": ""}, fn=lambda n: "x" * n)
    assert call_tool(tool, {"n": 500}) == ("x" * 500, None)
    text, kind = call_tool(tool, {"n": 501})
    assert kind is None and len(text) == 500 and text.endswith("... (501 characters, cut)")
    text, _ = call_tool(tool, {"n": 10_000}, max_chars=100)
    assert len(text) == 100 and text.startswith("x" * 70)


# --------------------------------------------------------------------------- time limits and replies that are no text


@pytest.fixture
def release():
    """Lets the abandoned calls of a test return once it is over."""
    event = threading.Event()
    yield event
    event.set()


def test_a_call_past_the_time_limit_is_an_error_reply(release, caplog):
    tool = Tool("stuck", "Never answers.", {}, fn=lambda: release.wait(), timeout_seconds=0.2)
    abandoned: list[threading.Thread] = []
    with caplog.at_level(logging.WARNING, logger="grpo_rl.envs.tools.registry"):
        reply = call_tool(tool, {}, abandoned=abandoned)
    assert reply == ("error: stuck did not answer within 0.2 s", "timeout")
    # the call came back while the tool still waits for its release: it was abandoned, not waited for
    assert not release.is_set() and len(abandoned) == 1 and abandoned[0].is_alive()
    assert "tool 'stuck' ran past its timeout_seconds=0.2 (env.tools)" in caplog.text


def test_a_tool_whose_calls_still_run_is_not_called_again(release):
    calls = []

    def stuck():
        calls.append(1)
        release.wait()
        return "late"

    tool = Tool("stuck", "Never answers.", {}, fn=stuck, timeout_seconds=0.05)
    abandoned: list[threading.Thread] = []
    for _ in range(MAX_ABANDONED_CALLS):
        assert call_tool(tool, {}, abandoned=abandoned)[1] == "timeout"
    assert len(calls) == len(abandoned) == MAX_ABANDONED_CALLS
    text, kind = call_tool(tool, {}, abandoned=abandoned)
    # not called, so not waited for: no call entered the tool and no thread was started for one
    assert len(calls) == len(abandoned) == MAX_ABANDONED_CALLS
    assert kind == "timeout" and text == (
        f"error: stuck was not called: {MAX_ABANDONED_CALLS} earlier calls are "
        "still running past its time limit of 0.05 s"
    )
    release.set()
    for thread in abandoned:
        thread.join(10)
    # they returned: the tool is called again (and now answers at once)
    assert call_tool(tool, {}, abandoned=abandoned) == ("late", None) and len(calls) == MAX_ABANDONED_CALLS + 1


class _Unprintable:
    def __str__(self):
        raise RuntimeError("no text")


@pytest.mark.parametrize(
    "out, says",
    [
        (None, "error: t returned None, not a reply; a tool returns its reply as text"),
        (_Unprintable(), "error: t returned a _Unprintable whose str() raised RuntimeError"),
        ("ok \ud800", "error: t returned text that is not valid Unicode (at character 3)"),
    ],
)
def test_a_reply_that_is_no_text_is_an_error_reply(out, says):
    for timeout in (None, 5.0):  # in the calling thread, and in a worker
        assert call_tool(Tool("t", "Garbage.", {}, fn=lambda: out, timeout_seconds=timeout), {}) == (says, "bad_output")


def test_configured_tools_get_their_time_limit(tools_file):
    spec = SimpleNamespace(name="weather", path=str(tools_file), timeout_seconds=2.5)
    builtin = SimpleNamespace(name="calculator", path=None, timeout_seconds=None)
    tools = configured_tools([spec, builtin])
    assert tools["weather"].timeout_seconds == 2.5 and tools["calculator"].timeout_seconds is None
    assert BUILTIN_TOOLS["calculator"].timeout_seconds is None  # the shared built-in is left as it was
    spec.timeout_seconds = 0
    with pytest.raises(ConfigError, match=r"^env.tools\[0\].timeout_seconds=0 must be > 0"):
        configured_tools([spec])


# --------------------------------------------------------------------------- the built-in calculator


def test_builtin_calculator_through_a_parsed_call():
    tool = BUILTIN_TOOLS["calculator"]
    call = parse_tool_call('<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>')
    assert call_tool(BUILTIN_TOOLS[call.name], call.arguments) == ("84", None)
    assert call_tool(tool, {"expression": "0.1+0.2"}) == ("0.3", None)
    assert call_tool(tool, {"expression": 12}) == ("12", None)  # a JSON number


@pytest.mark.parametrize(
    "expression, kind",
    [
        ("9**9**9", "too_large"),
        ("1/0", "zero_division"),
        ("x", "disallowed"),
        ("2+", "syntax"),
        ("1" * 300, "too_long"),
        ("-" * 150 + "1", "too_deep"),
        ("(-1)**0.5", "domain"),
    ],
)
def test_builtin_calculator_errors_are_counted_by_kind(expression, kind):
    text, got = call_tool(BUILTIN_TOOLS["calculator"], {"expression": expression})
    assert got == kind and kind in KINDS
    assert text.startswith("error: ") and "CalculatorError" not in text


def test_builtin_calculator_describes_itself():
    tool = BUILTIN_TOOLS["calculator"]
    assert set(tool.parameters) == {"expression"} and tool.example == {"expression": "12*7"}
    assert call_tool(tool, {})[1] == "bad_arguments"
