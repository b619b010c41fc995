"""Strict/loose scoring, the registry's contract, and a run over the real data.

Reference: google-research `instruction_following_eval/evaluation_lib.py` and
`instructions_registry.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from grpo_rl.envs.tasks.ifeval.instructions import (
    INSTRUCTION_IDS,
    IFEvalResult,
    build_checker,
    evaluate_response,
    loose_variants,
)

# The reference registry's 25 ids (instructions_registry.INSTRUCTION_DICT).
REFERENCE_IDS = {
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "keywords:letter_frequency",
    "language:response_language",
    "length_constraints:number_sentences",
    "length_constraints:number_paragraphs",
    "length_constraints:number_words",
    "length_constraints:nth_paragraph_first_word",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "detectable_format:number_bullet_lists",
    "detectable_format:constrained_response",
    "detectable_format:number_highlighted_sections",
    "detectable_format:multiple_sections",
    "detectable_format:json_format",
    "detectable_format:title",
    "combination:two_responses",
    "combination:repeat_prompt",
    "startend:end_checker",
    "change_case:capital_word_frequency",
    "change_case:english_capital",
    "change_case:english_lowercase",
    "punctuation:no_comma",
    "startend:quotation",
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_instruction_ids_are_the_reference_registry() -> None:
    assert isinstance(INSTRUCTION_IDS, tuple)
    assert len(INSTRUCTION_IDS) == 25
    assert set(INSTRUCTION_IDS) == REFERENCE_IDS


def test_loose_variants_in_reference_order() -> None:
    # lines: "*A*", " B ", "*C* "; the three line-trimmed variants are also
    # stripped of outer whitespace, the full response is not.
    assert loose_variants("*A*\n B \n*C* ") == (
        "*A*\n B \n*C* ",  # as is
        "A\n B \nC ",  # without '*'
        "B \n*C*",  # first line removed, stripped
        "*A*\n B",  # last line removed, stripped
        "B",  # both removed, stripped
        "B \nC",  # first removed, without '*'
        "A\n B",  # last removed, without '*'
        "B",  # both removed, without '*'
    )


@pytest.mark.parametrize(
    ("response", "instruction_id", "kwargs", "strict", "loose"),
    [
        # The preamble line breaks the quotes; dropping the first line fixes it.
        ('Here you go:\n"Hello world"', "startend:quotation", {}, False, True),
        # A sign-off after the phrase; dropping the last line fixes it.
        (
            "Body. Any other questions?\nHope this helps",
            "startend:end_checker",
            {"end_phrase": "Any other questions?"},
            False,
            True,
        ),
        # One line, so dropping lines leaves blanks (skipped); removing '*' fixes it.
        ('**{"a": 1}**', "detectable_format:json_format", {}, False, True),
        # No variant helps: strict and loose both fail.
        ("One, two", "punctuation:no_comma", {}, False, False),
        # Passing strictly implies passing loosely.
        ("No commas.", "punctuation:no_comma", {}, True, True),
    ],
)
def test_strict_and_loose(response: str, instruction_id: str, kwargs: dict, strict: bool, loose: bool) -> None:
    result = evaluate_response(response, [instruction_id], [kwargs], prompt="p")
    assert result.strict == [strict]
    assert result.loose == [loose]


@pytest.mark.parametrize("response", ["", "   \n\t"])
def test_blank_response_follows_nothing(response: str) -> None:
    # forbidden_words and no_comma would pass on any text without the word or
    # comma, but the reference fails every instruction for a blank response.
    result = evaluate_response(
        response,
        ["keywords:forbidden_words", "punctuation:no_comma"],
        [{"forbidden_words": ["cat"]}, {}],
        prompt="p",
    )
    assert result.strict == [False, False]
    assert result.loose == [False, False]


def test_prompt_and_instruction_level_aggregates() -> None:
    result = evaluate_response(
        "Sure:\n<<Title>>, with a comma",
        ["detectable_format:title", "punctuation:no_comma", "startend:quotation"],
        [{}, {}, {}],
        prompt="p",
    )
    # title: present strictly. no_comma: the comma is on the last line, which
    # the "last line removed" variant drops. quotation: no variant is quoted.
    assert result.strict == [True, False, False]
    assert result.loose == [True, True, False]
    assert result.prompt_strict is False and result.prompt_loose is False
    assert result.inst_strict_frac == pytest.approx(1 / 3)
    assert result.inst_loose_frac == pytest.approx(2 / 3)


def test_result_properties_all_pass() -> None:
    result = IFEvalResult(strict=[True, False], loose=[True, True])
    assert result.prompt_strict is False
    assert result.prompt_loose is True
    assert result.inst_strict_frac == 0.5
    assert result.inst_loose_frac == 1.0


def test_result_rejects_mismatched_flags() -> None:
    with pytest.raises(ValueError):
        IFEvalResult(strict=[True], loose=[True, False])


def test_unknown_id_raises_naming_it_and_the_supported_ids() -> None:
    with pytest.raises(ValueError) as error:
        evaluate_response("x", ["keywords:key_sentences"], [{}], prompt="p")
    message = str(error.value)
    assert "keywords:key_sentences" in message
    assert all(instruction_id in message for instruction_id in INSTRUCTION_IDS)


def test_none_kwargs_are_dropped_as_in_the_hugging_face_copy() -> None:
    # The HF copy of IFEval lists every kwarg name, with null where unused.
    hf_kwargs = {
        "num_highlights": None,
        "relation": "at least",
        "num_words": 3,
        "num_placeholders": None,
        "prompt_to_repeat": None,
        "num_bullets": None,
        "section_spliter": None,
        "num_sections": None,
        "capital_relation": None,
        "capital_frequency": None,
        "keywords": None,
        "num_paragraphs": None,
        "language": None,
        "let_relation": None,
        "letter": None,
        "let_frequency": None,
        "end_phrase": None,
        "forbidden_words": None,
        "keyword": None,
        "frequency": None,
        "num_sentences": None,
        "postscript_marker": None,
        "first_word": None,
        "nth_paragraph": None,
    }
    checker = build_checker("length_constraints:number_words", hf_kwargs)
    assert checker("one two three") is True  # 3 >= 3
    assert checker("one two") is False  # 2 < 3


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "fragment"),
    [
        ("length_constraints:number_words", {"relation": "at least"}, "missing: ['num_words']"),
        ("punctuation:no_comma", {"num_words": 3}, "unknown: ['num_words']"),
        ("length_constraints:number_words", {"relation": "at most", "num_words": 3}, "at most"),
        ("length_constraints:number_words", {"relation": "at least", "num_words": -1}, ">= 0"),
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "a"},
            "nth_paragraph",
        ),
        (
            "keywords:letter_frequency",
            {"letter": "ab", "let_frequency": 1, "let_relation": "at least"},
            "single character",
        ),
    ],
)
def test_bad_kwargs_raise(instruction_id: str, kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError) as error:
        build_checker(instruction_id, kwargs)
    assert fragment in str(error.value)
    assert instruction_id in str(error.value)


def test_mismatched_lists_raise() -> None:
    with pytest.raises(ValueError):
        evaluate_response("x", ["punctuation:no_comma"], [], prompt="p")


def _ifeval_data_file() -> Path:
    root = os.environ.get("GRPO_DATA_DIR")
    data_dir = Path(root) if root else Path(__file__).resolve().parents[3].parent / "shared" / "data"
    return data_dir / "ifeval" / "input_data.jsonl"


def test_all_541_prompts_evaluate_without_error() -> None:
    path = _ifeval_data_file()
    if not path.exists():
        pytest.skip(f"IFEval data not found at {path} (set GRPO_DATA_DIR to the shared data folder)")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    assert len(rows) == 541
    response = "Hello world. This is a dummy response, with *one* highlight.\nP.S. Bye."
    for row in rows:
        result = evaluate_response(response, row["instruction_id_list"], row["kwargs"], row["prompt"])
        assert len(result.strict) == len(result.loose) == len(row["instruction_id_list"])
        assert all(loose or not strict for strict, loose in zip(result.strict, result.loose, strict=True))
