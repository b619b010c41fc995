"""Answer extraction and rule-based rewards for GSM8K-style math problems.

Implements the verifiable "outcome" reward used for GSM8K in the GRPO paper
(Shao et al., 2024, "DeepSeekMath", arXiv:2402.03300): a response earns 1.0 when its
final numeric answer equals the reference, else 0.0. Departures from that setup:

* Answers are compared as exact ``fractions.Fraction`` values after a small, fixed
  normalisation (``$``, ``%``, thousands commas, ``3/4`` == ``0.75``), never by
  evaluating model text: no ``eval``, no sympy, no LaTeX parsing beyond ``\\frac{a}{b}``.
* A shaped :func:`format_reward` is added so a very small policy (135M parameters)
  has a signal to climb before it ever gets an answer right.
* With the ``tags`` template, an optional :func:`thinking_reward` scores the ``<think>`` section
  (``reward.thinking_weight``): empty or shorter than ``reward.min_thinking_tokens`` scores 0.

Every reward is a plain function ``(responses, references) -> list[float]`` so it can
be tested and composed without a model.
"""

from __future__ import annotations

import fractions
import re
from collections.abc import Callable

__all__ = [
    "correctness_reward",
    "extract_answer",
    "format_reward",
    "normalize_number",
    "reference_answer",
]

# One number token as it appears in prose: optional sign and dollar sign, an integer
# part with or without thousands commas, optional decimals, an optional integer
# denominator ("3/4") and an optional percent sign. The lookbehind stops a match from
# starting inside a word or another number ("x2", the "5" of "4.5", the "-3" of
# "10-3"). The lookahead after the comma form sends "1,2345" to the plain-digit branch.
_NUMBER = (
    r"(?<![\w.])"
    r"[-+\u2212]?\$?"
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:/\d+)?"
    r"%?"
)
_NUMBER_RE = re.compile(_NUMBER)
_HASH_RE = re.compile(r"#{4}[ \t]*(" + _NUMBER + r")")
# "The answer is 42", "Final answer: $42", "the answer is: **42**", "answer is \(42\)".
_ANSWER_PHRASE_RE = re.compile(
    r"\banswer\b(?:\s+is\b)?[\s:=*_`]*(?:\\[(\[]\s*)?(" + _NUMBER + r")",
    re.IGNORECASE,
)
_BOXED_TOKEN_RE = re.compile(r"\\boxed\{|[{}]")
# Only the last few boxes are searched for a number: enough for any real response,
# and it keeps deeply nested degenerate output from costing quadratic time.
_MAX_BOXES_SEARCHED = 8
_LATEX_FRAC_RE = re.compile(r"\\[dt]?frac\{\s*([-+]?\d+)\s*\}\{\s*(\d+)\s*\}")
# LaTeX spellings that hide a plain number: "1{,}234", "1\,234", "\$5", "50\%".
_LATEX_SUBSTITUTIONS = (("{,}", ","), ("\\,", ""), ("\\!", ""), ("\\$", "$"), ("\\%", "%"))

# A strict grammar for normalize_number: what is left after stripping decoration
# must be exactly a decimal or an integer fraction.
_DECIMAL_RE = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
_FRACTION_RE = re.compile(r"(-?\d+)/(\d+)")
_THOUSANDS_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d*)?")


def _last_number(text: str) -> str | None:
    matches = _NUMBER_RE.findall(text)
    return matches[-1] if matches else None


def _boxed_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of the contents of every closed ``\\boxed{...}``, by start."""
    spans = []
    # one pass with a stack: nested braces are matched and unbalanced output costs linear time
    stack: list[int] = []  # per open brace: where its contents start if boxed, else -1
    for token in _BOXED_TOKEN_RE.finditer(text):
        if token.group() == "{":
            stack.append(-1)
        elif token.group() == "}":
            if stack and (start := stack.pop()) >= 0:
                spans.append((start, token.start()))
        else:
            stack.append(token.end())
    return sorted(spans)


def _answer_tag_contents(text: str) -> list[str]:
    """Contents of every ``<answer>...</answer>``, in order, like a non-greedy regex."""
    contents = []
    # str.find, not <answer>(.*?)</answer>: quadratic on output that repeats <answer> without closing it
    start = text.find("<answer>")
    while start != -1:
        end = text.find("</answer>", start)
        if end == -1:
            break
        contents.append(text[start + len("<answer>") : end])
        start = text.find("<answer>", end)
    return contents


def _number_in_latex(content: str) -> str | None:
    content = _LATEX_FRAC_RE.sub(r"\1/\2", content)
    for latex, plain in _LATEX_SUBSTITUTIONS:
        content = content.replace(latex, plain)
    return _last_number(content)


def extract_answer(text: str, *, last_number_fallback: bool = True) -> str | None:
    """The final numeric answer of a model response as written (``"$1,234.50"``, ``"-3/4"``, ``"50%"``; a boxed
    ``\\frac{3}{4}`` as ``"3/4"``), or None; matched with regular expressions only, never evaluated.

    The first that yields a number wins: the last ``#### N``; the last ``\\boxed{...}`` holding a number; the last
    ``<answer>...</answer>`` holding a number (its last number: ``<answer>2 + 3 = 5</answer>`` gives ``5``); the last
    "the answer is N" / "final answer: N" (case-insensitive); with ``last_number_fallback``, the last number.
    """
    hashes = _HASH_RE.findall(text)
    if hashes:
        return hashes[-1]
    for start, end in reversed(_boxed_spans(text)[-_MAX_BOXES_SEARCHED:]):
        number = _number_in_latex(text[start:end])
        if number is not None:
            return number
    for content in reversed(_answer_tag_contents(text)):
        number = _last_number(content)
        if number is not None:
            return number
    phrases = _ANSWER_PHRASE_RE.findall(text)
    if phrases:
        return phrases[-1]
    if last_number_fallback:
        return _last_number(text)
    return None


def normalize_number(s: str) -> fractions.Fraction | None:
    """The exact value of a written number (``"3.50"``, ``"3.5"`` and ``"7/2"`` give ``Fraction(7, 2)``, ``"50%"``
    ``Fraction(50)``), or None when ``s`` is not a number (units, words, a zero denominator, ``"1,2"``).

    Surrounding whitespace, inner spaces, ``$``, ``%``, a leading ``+``, trailing periods and thousands commas are
    dropped; negatives (the Unicode minus too), decimals and integer fractions are accepted.
    """
    t = s.strip().replace("\u2212", "-").replace(" ", "")
    t = t.rstrip(".").replace("$", "").replace("%", "")  # % is decoration, as GSM8K's references write it
    sign = ""
    if t and t[0] in "+-":
        sign, t = ("-" if t[0] == "-" else ""), t[1:]
    if "," in t:
        # Only well-formed thousands groups: "1,2" is more likely a list or a
        # European decimal than twelve, so refuse it rather than guess.
        if not _THOUSANDS_RE.fullmatch(t):
            return None
        t = t.replace(",", "")
    t = sign + t
    try:
        if _DECIMAL_RE.fullmatch(t):
            return fractions.Fraction(t)
        match = _FRACTION_RE.fullmatch(t)
        if match and int(match.group(2)) != 0:
            return fractions.Fraction(int(match.group(1)), int(match.group(2)))
    except ValueError:
        # More digits than Python converts from a string (4300 by default): degenerate
        # output, not an answer, so it is no number rather than a crash of the reward.
        return None
    return None


def reference_answer(gsm8k_answer_field: str) -> str:
    """The final answer of a GSM8K ``answer`` field: the text after its last ``####``, stripped (``"1,234"``);
    raises ValueError without one or with nothing after it."""
    _, marker, tail = gsm8k_answer_field.rpartition("####")
    answer = tail.strip()
    if not marker or not answer:
        raise ValueError(f"GSM8K answer field has no final answer after '####': {gsm8k_answer_field[-200:]!r}")
    return answer


def _check_lengths(responses: list[str], references: list[str]) -> None:
    if len(responses) != len(references):
        raise ValueError(
            f"got {len(responses)} responses but {len(references)} references; "
            "pass one reference per response (repeat each one group_size times)"
        )


def correctness_reward(
    responses: list[str],
    references: list[str],
    *,
    last_number_fallback: bool = True,
) -> list[float]:
    """``[N]`` 1.0 for each response whose extracted answer (:func:`extract_answer`) equals its reference (a final
    answer such as ``"1,234"``, or a whole GSM8K ``answer`` field), else 0.0.

    Raises:
        ValueError: the lengths differ or a reference is not a number.
    """
    _check_lengths(responses, references)
    rewards = []
    for i, (response, reference) in enumerate(zip(responses, references, strict=True)):
        if "####" in reference:
            reference = reference_answer(reference)
        expected = normalize_number(reference)
        if expected is None:  # a data bug: it must not silently score every response 0
            raise ValueError(f"reference {i} is not a number: {reference!r}")
        answer = extract_answer(response, last_number_fallback=last_number_fallback)
        got = normalize_number(answer) if answer is not None else None
        rewards.append(1.0 if got == expected else 0.0)
    return rewards


_HASH_LAST_LINE_RE = re.compile(r"#{4}[ \t]*" + _NUMBER + r"[ \t]*")
_HASH_MARKER_RE = re.compile(r"#{4,}")
_TAGS_END_RE = re.compile(r"</think>\s*<answer>\s*" + _NUMBER + r"\s*</answer>\Z")


def _hash_format_score(response: str) -> float:
    text = response.strip()
    if text.endswith("."):
        text = text[:-1].rstrip()
    last_line = text.rsplit("\n", 1)[-1].strip()
    if _HASH_LAST_LINE_RE.fullmatch(last_line) and len(_HASH_MARKER_RE.findall(text)) == 1:
        return 1.0
    return 0.5 if _HASH_RE.search(text) else 0.0


def _tags_format_score(response: str) -> float:
    text = response.strip()
    # One answer tag only: repeating tags must not be a way to hedge between answers.
    if text.count("<answer>") == 1:
        end = _TAGS_END_RE.search(text)
        if end and "<think>" in text[: end.start()]:
            return 1.0
    has_number = any(_NUMBER_RE.search(c) for c in _answer_tag_contents(text))
    return 0.5 if has_number else 0.0


_FORMAT_SCORERS = {"hash": _hash_format_score, "tags": _tags_format_score}


def format_reward(
    responses: list[str],
    references: list[str],
    *,
    template: str = "hash",
) -> list[float]:
    """``[N]`` shaped reward for writing the final answer in the expected format (not for its correctness).

    ``template="hash"``: 1.0 when the response ends (ignoring surrounding whitespace and one trailing period) with a
    line ``#### <number>`` and ``####`` appears exactly once; 0.5 when ``####`` followed by a number appears
    anywhere; else 0.0. ``template="tags"``: 1.0 when ``<think>...</think>`` is followed by
    ``<answer><number></answer>`` at the very end, with a single ``<answer>`` tag; 0.5 when some
    ``<answer>...</answer>`` contains a number; else 0.0. ``references`` is unused (every reward takes it).

    Raises:
        ValueError: the lengths differ or ``template`` is unknown.
    """
    _check_lengths(responses, references)
    try:
        score = _FORMAT_SCORERS[template]
    except KeyError:
        raise ValueError(f"unknown format template {template!r}; expected one of {sorted(_FORMAT_SCORERS)}") from None
    return [score(response) for response in responses]


_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def thinking_reward(
    responses: list[str],
    references: list[str],
    *,
    count_tokens: Callable[[str], int],
    min_tokens: int,
) -> list[float]:
    """``[N]`` 1.0 for a response with exactly one ``<think>...</think>`` section holding at least ``min_tokens``
    tokens (by ``count_tokens``, stripped), else 0.0, as the reasoning recipes' format/thinking/answer scoring does;
    ``references`` is unused."""
    _check_lengths(responses, references)
    rewards = []
    for response in responses:
        sections = _THINK_RE.findall(response)
        # empty, short, missing, unclosed or several score 0: it cannot be skipped, padded in pieces or left open
        ok = (
            len(sections) == 1
            and response.count("<think>") == 1
            and sections[0].strip() != ""
            and count_tokens(sections[0].strip()) >= min_tokens
        )
        rewards.append(1.0 if ok else 0.0)
    return rewards


class TokenCounter:
    """``len(tokenizer.encode(text))`` without special tokens; a picklable callable for :func:`thinking_reward`."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))
