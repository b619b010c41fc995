r"""IFEval checkers for response length: sentences, paragraphs and words.

Reference: google-research `instruction_following_eval/instructions.py`:
`NumberOfSentences` (length_constraints:number_sentences), `ParagraphChecker`
(length_constraints:number_paragraphs), `NumberOfWords`
(length_constraints:number_words) and `ParagraphFirstWordCheck`
(length_constraints:nth_paragraph_first_word).

Reference quirks kept on purpose:

* Sentences are NLTK English Punkt sentences and words are `\w+` runs
  (see `text.py`): "It's 5 p.m. now." is one sentence of six words.
* number_paragraphs splits on the markdown divider `***` (with at most one
  whitespace character swallowed on each side) and wants an *exact* count.
  An empty piece before the first or after the last divider is not counted;
  an empty piece between two dividers fails the instruction outright.
* nth_paragraph_first_word splits on the literal "\n\n" instead (so "***"
  is not a separator there, and "\n \n" does not split). Blank pieces are
  not counted, but the nth paragraph is looked up in the list *with* them, so
  a blank piece before it shifts which text is checked (and a blank nth piece
  fails). The first word is the first whitespace-separated token with leading
  `'` then `"` stripped, cut at the first of `. , ? ! ' "`, lower-cased:
  '"Hello,' gives "hello" and "Don't" gives "don".

Departures: missing, negative or out-of-range numbers (e.g. nth_paragraph
greater than num_paragraphs) raise `ValueError`; the reference would draw
random ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from grpo_rl.envs.tasks.ifeval.instructions.text import count_sentences, count_words
from grpo_rl.envs.tasks.ifeval.instructions.thresholds import Relation, compare, validate_count, validate_relation

_FIRST_WORD_STOP_CHARS = frozenset(".,?!'\"")


@dataclass(frozen=True)
class NumberOfSentences:
    """The number of Punkt sentences satisfies the relation."""

    instruction_id: ClassVar[str] = "length_constraints:number_sentences"
    num_sentences: int
    relation: Relation

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_sentences", validate_count("num_sentences", self.num_sentences))
        object.__setattr__(self, "relation", validate_relation(self.relation))

    def __call__(self, response: str) -> bool:
        return compare(count_sentences(response), self.relation, self.num_sentences)


@dataclass(frozen=True)
class NumberOfWords:
    r"""The number of `\w+` words satisfies the relation."""

    instruction_id: ClassVar[str] = "length_constraints:number_words"
    num_words: int
    relation: Relation

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_words", validate_count("num_words", self.num_words))
        object.__setattr__(self, "relation", validate_relation(self.relation))

    def __call__(self, response: str) -> bool:
        return compare(count_words(response), self.relation, self.num_words)


@dataclass(frozen=True)
class NumberOfParagraphs:
    """Exactly `num_paragraphs` non-empty paragraphs separated by `***`."""

    instruction_id: ClassVar[str] = "length_constraints:number_paragraphs"
    num_paragraphs: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_paragraphs", validate_count("num_paragraphs", self.num_paragraphs))

    def __call__(self, response: str) -> bool:
        pieces = re.split(r"\s?\*\*\*\s?", response)
        count = len(pieces)
        for index, piece in enumerate(pieces):
            if piece.strip():
                continue
            if index in (0, len(pieces) - 1):
                count -= 1  # A divider at the very start or end adds no paragraph.
            else:
                return False  # Two dividers with nothing between them.
        return count == self.num_paragraphs


def _first_word(paragraph: str) -> str:
    """The reference's notion of a paragraph's first word, lower-cased."""
    word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    letters: list[str] = []
    for char in word:
        if char in _FIRST_WORD_STOP_CHARS:
            break
        letters.append(char.lower())
    return "".join(letters)


@dataclass(frozen=True)
class NthParagraphFirstWord:
    r"""Exactly `num_paragraphs` "\n\n"-paragraphs; the nth starts with `first_word`."""

    instruction_id: ClassVar[str] = "length_constraints:nth_paragraph_first_word"
    num_paragraphs: int
    nth_paragraph: int
    first_word: str

    def __post_init__(self) -> None:
        num_paragraphs = validate_count("num_paragraphs", self.num_paragraphs)
        nth_paragraph = validate_count("nth_paragraph", self.nth_paragraph, minimum=1)
        if nth_paragraph > num_paragraphs:
            raise ValueError(f"nth_paragraph ({nth_paragraph}) must be <= num_paragraphs ({num_paragraphs})")
        if not isinstance(self.first_word, str):
            raise ValueError(f"first_word must be a string, got {self.first_word!r}")
        object.__setattr__(self, "num_paragraphs", num_paragraphs)
        object.__setattr__(self, "nth_paragraph", nth_paragraph)
        object.__setattr__(self, "first_word", self.first_word.lower())

    def __call__(self, response: str) -> bool:
        pieces = response.split("\n\n")
        count = sum(1 for piece in pieces if piece.strip())
        if self.nth_paragraph > count:
            return False
        # Indexes the list that still holds blank pieces, as the reference does.
        paragraph = pieces[self.nth_paragraph - 1].strip()
        if not paragraph:
            return False
        return count == self.num_paragraphs and _first_word(paragraph) == self.first_word
