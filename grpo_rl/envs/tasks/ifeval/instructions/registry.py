"""The registry of IFEval instruction ids and how to build their checkers.

Reference: google-research `instruction_following_eval/instructions_registry.py`
(`INSTRUCTION_DICT`): the same 25 ids, in the same order. The ids the
reference leaves commented out (keywords:key_sentences,
detectable_content:rephrase_paragraph, detectable_format:rephrase,
multi-turn:constrained_start) are not supported here either.

Each checker is a frozen dataclass whose fields are exactly the kwargs its
instruction takes (named as in the data files) and which, called on a
response, says whether the response follows the instruction.

Departures: kwargs whose value is None are dropped first (the Hugging Face
copy of the data stores every unused kwarg as null); a missing or unknown
kwarg raises `ValueError` (the reference draws a random value for the one,
and raises `TypeError` for the other); an unknown id raises `ValueError`
(the reference raises `KeyError`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Protocol

from grpo_rl.envs.tasks.ifeval.instructions import (
    checkers_case,
    checkers_format,
    checkers_keywords,
    checkers_length,
    checkers_startend,
)


class Checker(Protocol):
    """Checks one instruction, with its kwargs already bound."""

    instruction_id: ClassVar[str]

    def __call__(self, response: str) -> bool:
        """Whether `response` follows the instruction."""
        ...


# In the reference registry's order.
CHECKER_TYPES: tuple[type[Checker], ...] = (
    checkers_keywords.KeywordExistence,
    checkers_keywords.KeywordFrequency,
    checkers_keywords.ForbiddenWords,
    checkers_keywords.LetterFrequency,
    checkers_case.ResponseLanguage,
    checkers_length.NumberOfSentences,
    checkers_length.NumberOfParagraphs,
    checkers_length.NumberOfWords,
    checkers_length.NthParagraphFirstWord,
    checkers_format.NumberPlaceholders,
    checkers_format.Postscript,
    checkers_format.NumberBulletLists,
    checkers_format.ConstrainedResponse,
    checkers_format.NumberHighlightedSections,
    checkers_format.MultipleSections,
    checkers_format.JsonFormat,
    checkers_format.Title,
    checkers_startend.TwoResponses,
    checkers_startend.RepeatPrompt,
    checkers_startend.EndChecker,
    checkers_case.CapitalWordFrequency,
    checkers_case.EnglishCapital,
    checkers_case.EnglishLowercase,
    checkers_keywords.NoComma,
    checkers_startend.Quotation,
)

_CHECKER_BY_ID: dict[str, type[Checker]] = {cls.instruction_id: cls for cls in CHECKER_TYPES}

INSTRUCTION_IDS: tuple[str, ...] = tuple(_CHECKER_BY_ID)


def build_checker(instruction_id: str, kwargs: Mapping[str, object] | None) -> Checker:
    """The checker `(response: str) -> bool` of one instruction of a prompt.

    Args:
        instruction_id: An id such as "length_constraints:number_words".
        kwargs: The instruction's entry in the data's `kwargs` list, e.g. `{"num_words": 300, "relation": "at
            least"}`. None values are ignored; None means no kwargs.

    Raises:
        ValueError: The id is unknown, or the kwargs are missing, unknown or out of range for it.
    """
    checker_type = _CHECKER_BY_ID.get(instruction_id)
    if checker_type is None:
        raise ValueError(
            f"Unknown IFEval instruction id {instruction_id!r}; supported ids: {', '.join(INSTRUCTION_IDS)}"
        )
    given = {name: value for name, value in (kwargs or {}).items() if value is not None}
    expected = {field.name for field in dataclasses.fields(checker_type)}  # type: ignore[arg-type]
    unknown = sorted(set(given) - expected)
    missing = sorted(expected - set(given))
    if unknown or missing:
        raise ValueError(f"{instruction_id} takes kwargs {sorted(expected)}; unknown: {unknown}, missing: {missing}")
    try:
        return checker_type(**given)
    except ValueError as error:
        raise ValueError(f"{instruction_id}: {error}") from error
