"""IFEval checkers for detectable markup: lists, highlights, sections, JSON, ...

Reference: google-research `instruction_following_eval/instructions.py`:
`PlaceholderChecker` (detectable_content:number_placeholders),
`PostscriptChecker` (detectable_content:postscript), `BulletListChecker`
(detectable_format:number_bullet_lists), `ConstrainedResponseChecker`
(detectable_format:constrained_response), `HighlightSectionChecker`
(detectable_format:number_highlighted_sections), `SectionChecker`
(detectable_format:multiple_sections), `JsonFormat`
(detectable_format:json_format) and `TitleChecker` (detectable_format:title).

Reference quirks kept on purpose:

* Placeholders are `[...]` on one line, at least `num_placeholders` of them;
  `[]` counts too.
* A postscript marker is found anywhere, not only at a line start, case
  insensitively: "P.S." also accepts "p. s.", and "P.P.S" also "p.p.s" with
  or without a trailing dot.
* Bullets are lines starting (after whitespace) with `*` not followed by
  another `*`, or with `-` (so a `---` rule counts as a bullet). The count must
  be exact.
* Highlights: `*text*` and `**text**` on one line count once each (the two
  patterns are matched separately; a bold phrase's inner `**` pairs are
  empty and so not counted twice). A pair with only whitespace inside, or
  split across lines, does not count.
* Sections: the case-sensitive splitter followed by optional whitespace and a
  number ("SECTION 1", "Section2"); at least `num_sections` of them.
* JSON: after stripping whitespace and one leading ```` ```json ````,
  ```` ```Json ````, ```` ```JSON ```` and ```` ``` ```` fence and one trailing
  ```` ``` ````, the rest must parse with `json.loads` (which also accepts
  `NaN` and a bare number or string).
* Title: `<<...>>` on one line, with something other than whitespace inside.
* constrained_response: one of "My answer is yes.", "My answer is no.",
  "My answer is maybe." appears anywhere (case-sensitive, dot included).

Departures: missing or negative counts and empty markers or splitters raise
`ValueError`; the reference would draw random ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import ClassVar

from grpo_rl.envs.tasks.ifeval.instructions.patterns import as_regex_fragment
from grpo_rl.envs.tasks.ifeval.instructions.thresholds import validate_count

CONSTRAINED_RESPONSE_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
_JSON_OPENING_FENCES = ("```json", "```Json", "```JSON", "```")


def _validate_marker(name: str, value: object) -> str:
    """Returns `value` stripped, or raises ValueError if it is not a non-blank string."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value.strip()


@dataclass(frozen=True)
class NumberPlaceholders:
    """At least `num_placeholders` single-line `[...]` placeholders."""

    instruction_id: ClassVar[str] = "detectable_content:number_placeholders"
    num_placeholders: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_placeholders", validate_count("num_placeholders", self.num_placeholders))

    def __call__(self, response: str) -> bool:
        return len(re.findall(r"\[.*?\]", response)) >= self.num_placeholders


@dataclass(frozen=True)
class Postscript:
    """A postscript starting with the marker ("P.S.", "P.P.S", ...) appears."""

    instruction_id: ClassVar[str] = "detectable_content:postscript"
    postscript_marker: str

    def __post_init__(self) -> None:
        marker = _validate_marker("postscript_marker", self.postscript_marker)
        object.__setattr__(self, "postscript_marker", marker)

    def _pattern(self) -> str:
        if self.postscript_marker == "P.P.S":
            return r"\s*p\.\s?p\.\s?s.*$"
        if self.postscript_marker == "P.S.":
            return r"\s*p\.\s?s\..*$"
        return r"\s*" + as_regex_fragment(self.postscript_marker.lower()) + r".*$"

    def __call__(self, response: str) -> bool:
        return bool(re.findall(self._pattern(), response.lower(), flags=re.MULTILINE))


@dataclass(frozen=True)
class NumberBulletLists:
    """Exactly `num_bullets` markdown bullet lines (`* item` or `- item`)."""

    instruction_id: ClassVar[str] = "detectable_format:number_bullet_lists"
    num_bullets: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_bullets", validate_count("num_bullets", self.num_bullets))

    def __call__(self, response: str) -> bool:
        star_bullets = re.findall(r"^\s*\*[^\*].*$", response, flags=re.MULTILINE)
        dash_bullets = re.findall(r"^\s*-.*$", response, flags=re.MULTILINE)
        return len(star_bullets) + len(dash_bullets) == self.num_bullets


@dataclass(frozen=True)
class ConstrainedResponse:
    """The response contains one of the three fixed answer sentences."""

    instruction_id: ClassVar[str] = "detectable_format:constrained_response"

    def __call__(self, response: str) -> bool:
        stripped = response.strip()
        return any(option in stripped for option in CONSTRAINED_RESPONSE_OPTIONS)


@dataclass(frozen=True)
class NumberHighlightedSections:
    """At least `num_highlights` markdown highlights (`*x*`; `**x**` counts twice)."""

    instruction_id: ClassVar[str] = "detectable_format:number_highlighted_sections"
    num_highlights: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_highlights", validate_count("num_highlights", self.num_highlights))

    def __call__(self, response: str) -> bool:
        single = re.findall(r"\*[^\n\*]*\*", response)
        double = re.findall(r"\*\*[^\n\*]*\*\*", response)
        count = sum(1 for match in single if match.strip("*").strip())
        count += sum(1 for match in double if match[2:-2].strip())
        return count >= self.num_highlights


@dataclass(frozen=True)
class MultipleSections:
    """At least `num_sections` "<splitter> <number>" section headers."""

    instruction_id: ClassVar[str] = "detectable_format:multiple_sections"
    section_spliter: str  # The reference's spelling, as in the data files.
    num_sections: int

    def __post_init__(self) -> None:
        splitter = _validate_marker("section_spliter", self.section_spliter)
        object.__setattr__(self, "section_spliter", splitter)
        object.__setattr__(self, "num_sections", validate_count("num_sections", self.num_sections))

    def __call__(self, response: str) -> bool:
        header = r"\s?" + as_regex_fragment(self.section_spliter) + r"\s?\d+\s?"
        return len(re.split(header, response)) - 1 >= self.num_sections


@dataclass(frozen=True)
class JsonFormat:
    """The whole response, minus one optional ``` fence, is valid JSON."""

    instruction_id: ClassVar[str] = "detectable_format:json_format"

    def __call__(self, response: str) -> bool:
        # One removeprefix per fence spelling, in order, as the reference
        # chains them: "```json```x" loses both "```json" and "```".
        body = response.strip()
        for fence in _JSON_OPENING_FENCES:
            body = body.removeprefix(fence)
        body = body.removesuffix("```").strip()
        try:
            json.loads(body)
        except ValueError:
            return False
        return True


@dataclass(frozen=True)
class Title:
    """A title in double angular brackets, `<<like this>>`, on one line."""

    instruction_id: ClassVar[str] = "detectable_format:title"

    def __call__(self, response: str) -> bool:
        titles = re.findall(r"<<[^\n]+>>", response)
        return any(title.lstrip("<").rstrip(">").strip() for title in titles)
