"""Tests for grpo_rl.envs.tasks.gsm8k.reward: answer extraction, normalisation and rewards.

Every expected value is written by hand from reading the input.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from grpo_rl.envs.tasks.gsm8k.reward import (
    correctness_reward,
    extract_answer,
    format_reward,
    normalize_number,
    reference_answer,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # "####" wins over everything else, and the last one wins among several.
        ("48 + 24 = 72\n#### 72", "72"),
        ("#### 1,234", "1,234"),
        ("#### $5.00", "$5.00"),
        ("#### -3", "-3"),
        ("#### 3/4", "3/4"),
        ("First #### 5, then corrected:\n#### 6", "6"),
        ("\\boxed{9} but #### 10", "10"),
        ("The answer is 3.\n#### 4", "4"),
        ("####    7", "7"),
        # \boxed: last one, nested braces, LaTeX fractions and separators.
        ("So the total is \\boxed{18}.", "18"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{3}{4}}", "3/4"),
        ("\\boxed{-\\dfrac{1}{2}}", "-1/2"),
        ("\\boxed{1{,}234}", "1,234"),
        ("\\boxed{\\$12}", "$12"),
        ("\\boxed{50\\%}", "50%"),
        ("\\boxed{x} is unknown; 8 apples", "8"),  # no number in the box: fall through
        ("\\boxed{x = 5 \\text{ apples}}", "5"),
        # <answer> tags: the last number inside the last tag that has one.
        ("<think>2+2</think><answer>4</answer>", "4"),
        ("<answer>2 + 3 = 5</answer>", "5"),
        ("<answer>1</answer> <answer>2</answer>", "2"),
        ("<answer> -0.5 </answer>", "-0.5"),
        ("<answer>none</answer> so 6", "6"),
        # Answer phrases, case-insensitive, last one.
        ("The answer is 42.", "42"),
        ("the answer is: **42**", "42"),
        ("Final answer: $1,000", "$1,000"),
        ("FINAL ANSWER: 12. Also 13 cats.", "12"),
        ("The answer is 3. No wait, the answer is 4.", "4"),
        ("The answer is \\(7\\)", "7"),
        # Last-number fallback.
        ("She has 3 apples and 5 pears, 8 fruits in total.", "8"),
        ("It drops to -5 degrees", "-5"),
        ("10-3=7", "7"),
        ("Half is 0.5 of it", "0.5"),
        ("That is 50% of them", "50%"),
        ("Costs $1,234.56 today", "$1,234.56"),
        ("We get .75 left", ".75"),
        ("3/4 of the pie", "3/4"),
        ("1, 2, 3", "3"),
        ("H2O and x2 are not numbers", None),
        ("no number here", None),
        ("", None),
        # Model text is text, never code.
        ("__import__('os').system('rm -rf /')", None),
        ("__import__('os').system('echo 1') #### 5", "5"),
        ("eval('2+2')", "2"),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I think 5 apples", None),
        ("#### 5", "5"),
        ("The answer is 6", "6"),
        ("<answer>7</answer>", "7"),
    ],
)
def test_extract_answer_without_fallback(text: str, expected: str | None) -> None:
    assert extract_answer(text, last_number_fallback=False) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("72", Fraction(72)),
        ("1,234", Fraction(1234)),
        ("1,234,567", Fraction(1234567)),
        ("$5.00", Fraction(5)),
        ("$ 5", Fraction(5)),
        ("5.", Fraction(5)),
        ("3.50", Fraction(7, 2)),
        ("3.5", Fraction(7, 2)),
        ("50%", Fraction(50)),
        ("-7", Fraction(-7)),
        ("\u22127", Fraction(-7)),
        ("+8", Fraction(8)),
        ("-$1,000.25", Fraction(-400100, 400)),
        ("3/4", Fraction(3, 4)),
        ("-1/2", Fraction(-1, 2)),
        ("3 / 4", Fraction(3, 4)),
        (".75", Fraction(3, 4)),
        ("  12  ", Fraction(12)),
        ("0", Fraction(0)),
        ("1,2", None),
        ("1,23,456", None),
        ("5 apples", None),
        ("abc", None),
        ("", None),
        ("1/0", None),
        ("1.5/2", None),
        ("--5", None),
        ("1e3", None),
        ("__import__('os')", None),
    ],
)
def test_normalize_number(text: str, expected: Fraction | None) -> None:
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    ("response", "reference", "expected"),
    [
        ("#### 1,234", "1234", 1.0),
        ("#### 1234", "1,234", 1.0),
        ("The answer is $5.00", "5", 1.0),
        ("#### 5.5", "5", 0.0),
        ("50% of them, so #### 50%", "50", 1.0),
        ("#### -3", "-3", 1.0),
        ("#### 3", "-3", 0.0),
        ("\\boxed{0.75}", "3/4", 1.0),
        ("#### 3/4", "0.75", 1.0),
        ("The answer is 42.", "42", 1.0),
        ("<think>6*7</think><answer>42</answer>", "42", 1.0),
        ("I had 10, gave 3, so 7 remain", "7", 1.0),
        ("7 remain from 10", "7", 0.0),  # last number is 10
        ("no idea", "7", 0.0),
        ("__import__('os').system('7')", "7", 1.0),  # the 7 is read, never run
        ("#### 72", "Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72", 1.0),
    ],
)
def test_correctness_reward(response: str, reference: str, expected: float) -> None:
    assert correctness_reward([response], [reference]) == [expected]


def test_correctness_reward_batch_and_fallback_flag() -> None:
    responses = ["#### 4", "so 4", "#### 5"]
    assert correctness_reward(responses, ["4", "4", "4"]) == [1.0, 1.0, 0.0]
    assert correctness_reward(responses, ["4", "4", "4"], last_number_fallback=False) == [
        1.0,
        0.0,
        0.0,
    ]


def test_correctness_reward_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="2 responses but 1 references"):
        correctness_reward(["a", "b"], ["1"])
    with pytest.raises(ValueError, match="reference 0 is not a number: 'seven'"):
        correctness_reward(["#### 7"], ["seven"])


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("48/2 = <<48/2=24>>24\n#### 72", "72"),
        ("#### 1,234  \n", "1,234"),
        ("a #### b\n#### -5", "-5"),
    ],
)
def test_reference_answer(field: str, expected: str) -> None:
    assert reference_answer(field) == expected


@pytest.mark.parametrize("field", ["48 + 24 = 72", "ends with marker ####   "])
def test_reference_answer_missing_marker(field: str) -> None:
    with pytest.raises(ValueError, match="no final answer after '####'") as info:
        reference_answer(field)
    assert field.strip()[:10] in str(info.value)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("48 + 24 = 72\n#### 72", 1.0),
        ("#### 72", 1.0),
        ("work\n#### 72.", 1.0),
        ("work\n#### 72\n\n  ", 1.0),
        ("work\n#### $1,234", 1.0),
        ("work\n#### -3/4", 1.0),
        ("#### 72\nwork\n#### 72", 0.5),  # marker twice
        ("#### 72 is my answer", 0.5),  # not alone on the last line
        ("I say #### 72", 0.5),
        ("#### 72\nThanks!", 0.5),
        ("#### seventy-two", 0.0),
        ("The answer is 72", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward_hash(response: str, expected: float) -> None:
    assert format_reward([response], ["72"]) == [expected]


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>6*7=42</think><answer>42</answer>", 1.0),
        ("<think>\nmulti\nline\n</think>\n<answer> 42 </answer>\n", 1.0),
        ("preamble <think>x</think><answer>-1.5</answer>", 1.0),
        ("<think>x</think><answer>42</answer> trailing", 0.5),
        ("<answer>42</answer>", 0.5),
        ("<think>x</think><answer>about 42 apples</answer>", 0.5),
        ("<think>x</think><answer>1</answer><answer>42</answer>", 0.5),
        ("<think>x</think><answer>forty-two</answer>", 0.0),
        ("<answer>42", 0.0),
        ("#### 42", 0.0),
    ],
)
def test_format_reward_tags(response: str, expected: float) -> None:
    assert format_reward([response], ["42"], template="tags") == [expected]


def test_format_reward_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="unknown format template 'xml'"):
        format_reward(["#### 1"], ["1"], template="xml")
    with pytest.raises(ValueError, match="1 responses but 2 references"):
        format_reward(["#### 1"], ["1", "2"])


def test_every_real_gsm8k_reference_scores_itself() -> None:
    """Each worked solution in GSM8K must earn 1.0 against its own final answer."""
    from grpo_rl.envs.data import data_dir, load_records

    root = data_dir()
    if root is None or not (root / "gsm8k" / "test.jsonl").is_file():
        pytest.skip("shared GSM8K data not found (set GRPO_DATA_DIR or provide ../shared/data)")
    records = load_records("gsm8k", split="test", path=str(root / "gsm8k"))
    solutions = [r["answer"] for r in records]
    references = [reference_answer(s) for s in solutions]
    assert all(normalize_number(ref) is not None for ref in references)
    assert correctness_reward(solutions, references) == [1.0] * len(records)
    assert format_reward(solutions, references) == [1.0] * len(records)


@pytest.mark.parametrize(
    ("response", "answer", "hash_score", "tags_score"),
    [
        # Degenerate, repetitive output: these took quadratic time (seconds) with
        # naive regexes, so a regression shows up as a slow test run.
        ("<answer>" * 20_000, None, 0.0, 0.0),
        ("\\boxed{" * 20_000 + "}" * 20_000, None, 0.0, 0.0),
        ("<think>" * 20_000 + "</think><answer>5</answer>", "5", 0.0, 1.0),
        ("#" * 100_000 + " 5", "5", 0.5, 0.0),  # not exactly "####", so not full marks
        ("answer is " * 20_000, None, 0.0, 0.0),
    ],
)
def test_degenerate_output(response: str, answer: str | None, hash_score: float, tags_score: float) -> None:
    assert extract_answer(response) == answer
    assert format_reward([response], ["5"]) == [hash_score]
    assert format_reward([response], ["5"], template="tags") == [tags_score]
