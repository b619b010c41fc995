"""Instruction strings used as regular expressions, as the reference does.

Reference: google-research `instruction_following_eval/instructions.py`
splices user-supplied strings (keywords, forbidden words, a section splitter,
a custom postscript marker) into regular expressions without escaping them, so
a keyword such as "e.g." also matches "eXgY". That behaviour is kept.

Departure: a string that is not a valid regular expression (e.g. "C++") makes
the reference raise `re.error`; here it is matched literally instead.
"""

from __future__ import annotations

import re


def as_regex_fragment(text: str) -> str:
    """`text` (from an instruction's kwargs) to splice into a regex: as is when it compiles, else `re.escape(text)`."""
    try:
        re.compile(text)
    except re.error:
        return re.escape(text)
    return text
