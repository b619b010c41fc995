"""IFEval checkers for how a response starts, ends, and is split in two.

Reference: google-research `instruction_following_eval/instructions.py`:
`EndChecker` (startend:end_checker), `QuotationChecker` (startend:quotation),
`TwoResponsesChecker` (combination:two_responses) and
`RepeatPromptThenAnswer` (combination:repeat_prompt).

Reference quirks kept on purpose:

* end_checker: the response, stripped of whitespace and then of any `"` at
  either end, lower-cased, must end with the lower-cased phrase. So
  '"... Any other questions?"' passes, and so does "...any other questions?".
* quotation: after stripping whitespace the response starts and ends with an
  ASCII `"` and is at least two characters long (curly quotes do not count).
* two_responses: split on "******"; blank pieces at either end are ignored, a
  blank piece in the middle fails, and there must be exactly two non-blank
  pieces that differ after stripping. Seven asterisks leave a stray "*" that
  counts as a piece.
* repeat_prompt: the stripped, lower-cased response starts with the stripped,
  lower-cased `prompt_to_repeat`.

Departure: a missing phrase or prompt raises `ValueError` (the reference picks
a random phrase, or raises for a missing prompt as well).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

TWO_RESPONSES_SEPARATOR = "******"


def _validate_text(name: str, value: object) -> str:
    """Returns `value` if it is a non-blank string, or raises ValueError."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True)
class EndChecker:
    """The response ends with `end_phrase` (case-insensitive, outer quotes ignored)."""

    instruction_id: ClassVar[str] = "startend:end_checker"
    end_phrase: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "end_phrase", _validate_text("end_phrase", self.end_phrase))

    def __call__(self, response: str) -> bool:
        ending = response.strip().strip('"').lower()
        return ending.endswith(self.end_phrase.strip().lower())


@dataclass(frozen=True)
class Quotation:
    """The whole response is wrapped in ASCII double quotes."""

    instruction_id: ClassVar[str] = "startend:quotation"

    def __call__(self, response: str) -> bool:
        stripped = response.strip()
        return len(stripped) > 1 and stripped[0] == '"' and stripped[-1] == '"'


@dataclass(frozen=True)
class TwoResponses:
    """Two different responses separated by six asterisks, and nothing else."""

    instruction_id: ClassVar[str] = "combination:two_responses"

    def __call__(self, response: str) -> bool:
        pieces = response.split(TWO_RESPONSES_SEPARATOR)
        answers: list[str] = []
        for index, piece in enumerate(pieces):
            if piece.strip():
                answers.append(piece.strip())
            elif index not in (0, len(pieces) - 1):
                return False  # Two separators with nothing between them.
        return len(answers) == 2 and answers[0] != answers[1]


@dataclass(frozen=True)
class RepeatPrompt:
    """The response starts by repeating `prompt_to_repeat` (case-insensitive)."""

    instruction_id: ClassVar[str] = "combination:repeat_prompt"
    prompt_to_repeat: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_to_repeat", _validate_text("prompt_to_repeat", self.prompt_to_repeat))

    def __call__(self, response: str) -> bool:
        return response.strip().lower().startswith(self.prompt_to_repeat.strip().lower())
