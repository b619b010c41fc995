"""IFEval checkers for the response's language and letter case.

Reference: google-research `instruction_following_eval/instructions.py`:
`ResponseLanguageChecker` (language:response_language),
`CapitalLettersEnglishChecker` (change_case:english_capital),
`LowercaseLettersEnglishChecker` (change_case:english_lowercase) and
`CapitalWordFrequencyChecker` (change_case:capital_word_frequency).

Reference quirks kept on purpose:

* When `langdetect` cannot decide (no letters at all, e.g. "12345"), the
  language part of an instruction counts as followed.
* english_capital / english_lowercase use `str.isupper()` / `str.islower()`:
  characters without case (digits, punctuation) are ignored, but at least one
  cased character is needed; the case test runs first, so a response in the
  wrong case fails whatever its language.
* capital_word_frequency counts `nltk.word_tokenize` tokens for which
  `str.isupper()` holds: "I" and "U.S." count, "Don't" splits into "Do" and
  "n't" and neither counts, "COVID-19" is one token and counts.

Departure: language detection is seeded (see `language.py`), so results are
reproducible where the reference's can vary between runs; a missing language
or frequency raises `ValueError` instead of being drawn at random.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from grpo_rl.envs.tasks.ifeval.instructions.language import detect_language
from grpo_rl.envs.tasks.ifeval.instructions.text import word_tokenize
from grpo_rl.envs.tasks.ifeval.instructions.thresholds import Relation, compare, validate_count, validate_relation


def _is_language(response: str, language: str) -> bool:
    """Whether `langdetect` reports `language`; True if it cannot decide."""
    detected = detect_language(response)
    return detected is None or detected == language


@dataclass(frozen=True)
class ResponseLanguage:
    """The whole response is detected as `language` (an ISO 639-1 code)."""

    instruction_id: ClassVar[str] = "language:response_language"
    language: str

    def __post_init__(self) -> None:
        if not isinstance(self.language, str) or not self.language:
            raise ValueError(f"language must be a language code, got {self.language!r}")

    def __call__(self, response: str) -> bool:
        return _is_language(response, self.language)


@dataclass(frozen=True)
class EnglishCapital:
    """All cased characters are upper case, and the response is English."""

    instruction_id: ClassVar[str] = "change_case:english_capital"

    def __call__(self, response: str) -> bool:
        return response.isupper() and _is_language(response, "en")


@dataclass(frozen=True)
class EnglishLowercase:
    """All cased characters are lower case, and the response is English."""

    instruction_id: ClassVar[str] = "change_case:english_lowercase"

    def __call__(self, response: str) -> bool:
        return response.islower() and _is_language(response, "en")


@dataclass(frozen=True)
class CapitalWordFrequency:
    """The number of all-capital word tokens satisfies the relation."""

    instruction_id: ClassVar[str] = "change_case:capital_word_frequency"
    capital_frequency: int
    capital_relation: Relation

    def __post_init__(self) -> None:
        object.__setattr__(self, "capital_frequency", validate_count("capital_frequency", self.capital_frequency))
        object.__setattr__(self, "capital_relation", validate_relation(self.capital_relation))

    def __call__(self, response: str) -> bool:
        count = sum(1 for token in word_tokenize(response) if token.isupper())
        return compare(count, self.capital_relation, self.capital_frequency)
