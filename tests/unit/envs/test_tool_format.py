"""Tests for the tool-call format (grpo_rl.envs.tools.format): parsing the first call with its end offset, the errors a
model's malformed call gets, and the system prompt."""

from __future__ import annotations

import json

import pytest

from grpo_rl.envs.tools.format import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolCall,
    ToolCallError,
    format_tool_call,
    parse_tool_call,
    tool_system_prompt,
)
from grpo_rl.envs.tools.registry import BUILTIN_TOOLS, Tool

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'


def test_a_call_is_parsed_with_its_end_offset():
    call = parse_tool_call(CALL)
    assert call == ToolCall("calculator", {"expression": "12*7"}, len(CALL))


def test_text_before_and_after_the_call():
    before, after = "I need 12 times 7.\n", "\nThe answer is 84."
    text = before + CALL + after
    call = parse_tool_call(text)
    assert isinstance(call, ToolCall)
    assert call.end == len(before) + len(CALL)
    assert text[: call.end] == before + CALL  # the environment cuts the turn here


def test_whitespace_inside_the_tags_is_allowed():
    call = parse_tool_call('<tool_call>\n{"name": "calculator",\n "arguments": {"expression": "1+1"}}\n</tool_call>')
    assert isinstance(call, ToolCall) and call.arguments == {"expression": "1+1"}


def test_the_first_of_two_calls_is_taken():
    second = '<tool_call>{"name": "other", "arguments": {}}</tool_call>'
    call = parse_tool_call(CALL + " and " + second)
    assert call.name == "calculator" and call.end == len(CALL)


@pytest.mark.parametrize("text", ["", "The answer is 84.", "</tool_call>", "<tool_call", "tool_call>{}"])
def test_no_call(text):
    assert parse_tool_call(text) is None


@pytest.mark.parametrize(
    "body, detail",
    [
        ('{"name": "calculator", "arguments": {"expression": "12*7"}', "not valid JSON"),
        ("calculator(12*7)", "not valid JSON"),
        ("", "not valid JSON"),
        ("[" * 100_000, "not valid JSON"),  # nesting beyond the JSON parser's recursion
        ('["calculator", "12*7"]', "expected a JSON object"),
        ('{"arguments": {"expression": "12*7"}}', 'no "name"'),
        ('{"name": "", "arguments": {}}', 'no "name"'),
        ('{"name": 3, "arguments": {}}', 'no "name"'),
        ('{"name": "calculator", "arguments": "12*7"}', '"arguments" must be an object'),
        ('{"name": "calculator", "arguments": ["12*7"]}', '"arguments" must be an object'),
        ('{"name": "calculator", "arguments": null}', '"arguments" must be an object'),
        ('{"name": "calculator", "arguments": "[1]"}', '"arguments" must be an object'),
    ],
)
def test_malformed_calls(body, detail):
    text = f"Let me compute. {TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE} done"
    error = parse_tool_call(text)
    assert isinstance(error, ToolCallError) and error.kind == "malformed"
    assert error.end == len(text) - len(" done")
    assert error.message.startswith("error: malformed tool call: ") and detail in error.message
    assert "\n" not in error.message and CALL in error.message  # shows the right form


def test_an_unclosed_call():
    text = 'Sure. <tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}'
    error = parse_tool_call(text)
    assert isinstance(error, ToolCallError) and error.kind == "unclosed" and error.end == len(text)
    assert TOOL_CALL_CLOSE in error.message
    # An engine that stopped at the closing tag left it out: appending it gives the call.
    assert parse_tool_call(text + TOOL_CALL_CLOSE).arguments == {"expression": "12*7"}


def test_arguments_encoded_as_a_json_string_are_accepted():
    body = json.dumps({"name": "calculator", "arguments": json.dumps({"expression": "12*7"})})
    call = parse_tool_call(TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE)
    assert isinstance(call, ToolCall) and call.arguments == {"expression": "12*7"}


def test_missing_arguments_mean_none_and_other_keys_are_ignored():
    assert parse_tool_call('<tool_call>{"name": "now"}</tool_call>').arguments == {}
    call = parse_tool_call('<tool_call>{"name": "now", "id": 3, "arguments": {}}</tool_call>')
    assert call == ToolCall("now", {}, len('<tool_call>{"name": "now", "id": 3, "arguments": {}}</tool_call>'))


def test_format_tool_call_round_trips():
    text = format_tool_call("calculator", {"expression": "12*7"})
    assert text == CALL
    assert parse_tool_call(text) == ToolCall("calculator", {"expression": "12*7"}, len(text))


def test_system_prompt_describes_the_tools_and_the_format():
    prompt = tool_system_prompt(list(BUILTIN_TOOLS.values()))
    assert "calculator" in prompt and "expression" in prompt
    assert CALL in prompt  # the exact call format, with an example that works
    assert "tool message" in prompt
    assert len(prompt) < 600  # short, for small models


def test_system_prompt_lists_every_tool_and_uses_placeholders_without_an_example():
    lookup = Tool("lookup", "Current weather in a city", {"city": "the city's name.", "units": ""}, fn=lambda **_: "")
    prompt = tool_system_prompt([lookup, BUILTIN_TOOLS["calculator"]])
    assert "- lookup: Current weather in a city. Arguments: city: the city's name; units." in prompt
    assert "- calculator: " in prompt
    assert format_tool_call("lookup", {"city": "...", "units": "..."}) in prompt
    with pytest.raises(ValueError):
        tool_system_prompt([])
