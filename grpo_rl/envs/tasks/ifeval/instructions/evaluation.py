"""Strict and loose IFEval scoring of one response, per prompt and instruction.

Reference: google-research `instruction_following_eval/evaluation_lib.py`
(`test_instruction_following_strict`, `test_instruction_following_loose`).

* Strict: each instruction's checker is run on the response as is. A
  response that is empty or only whitespace follows no instruction.
* Loose: the checker is run on eight variants of the response and the
  instruction counts as followed if any non-blank variant passes. The variants
  are the response, the response without its first line, without its last
  line, and without both (those three stripped of outer whitespace), each
  also with every `*` removed. This forgives a preamble such as "Sure, here it
  is:" and markdown emphasis.
* Prompt level: all of a prompt's instructions are followed; instruction
  level: the fraction of them that are.

Departure: none in the scoring itself. The `prompt` argument mirrors the
reference loop, which passes the prompt only to instructions that declare a
`prompt` kwarg; none of the 25 does, so it does not change any result
(combination:repeat_prompt reads its `prompt_to_repeat` kwarg instead).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from grpo_rl.envs.tasks.ifeval.instructions.registry import Checker, build_checker


@dataclass(frozen=True)
class IFEvalResult:
    """Which instructions of one prompt a response follows.

    Attributes:
        strict: One flag per instruction, in the prompt's order: followed by
            the response as is.
        loose: One flag per instruction: followed by at least one of the loose
            variants of the response (so `strict[i]` implies `loose[i]`).
    """

    strict: list[bool]
    loose: list[bool]

    def __post_init__(self) -> None:
        if len(self.strict) != len(self.loose) or not self.strict:
            raise ValueError(
                f"strict and loose need one flag per instruction and at least one "
                f"instruction, got {len(self.strict)} and {len(self.loose)}"
            )

    @property
    def prompt_strict(self) -> bool:
        """Every instruction is followed strictly."""
        return all(self.strict)

    @property
    def prompt_loose(self) -> bool:
        """Every instruction is followed loosely."""
        return all(self.loose)

    @property
    def inst_strict_frac(self) -> float:
        """Fraction of instructions followed strictly."""
        return sum(self.strict) / len(self.strict)

    @property
    def inst_loose_frac(self) -> float:
        """Fraction of instructions followed loosely."""
        return sum(self.loose) / len(self.loose)


def loose_variants(response: str) -> tuple[str, ...]:
    """The eight responses the loose evaluation tries, in the reference's order: the response; it without `*`;
    without its first line; without its last line; without both; and the last three without `*`."""
    lines = response.split("\n")
    without_first = "\n".join(lines[1:]).strip()
    without_last = "\n".join(lines[:-1]).strip()
    without_both = "\n".join(lines[1:-1]).strip()
    return (
        response,
        response.replace("*", ""),
        without_first,
        without_last,
        without_both,
        without_first.replace("*", ""),
        without_last.replace("*", ""),
        without_both.replace("*", ""),
    )


def _follows(checker: Checker, response: str) -> bool:
    """A blank response follows nothing; otherwise the checker decides."""
    return bool(response.strip()) and checker(response)


def evaluate_response(
    response: str,
    instruction_id_list: Sequence[str],
    kwargs_list: Sequence[Mapping[str, object] | None],
    prompt: str,
) -> IFEvalResult:
    """The strict and loose flags of one response, one per instruction of its IFEval prompt (`kwargs_list`: one
    mapping per instruction, None values ignored; `prompt` changes no result, as in the reference).

    Raises:
        ValueError: An id is unknown, kwargs do not fit their instruction, the two lists differ in length, or
            there are no instructions.
    """
    del prompt  # No supported instruction takes it; see the module docstring.
    if len(instruction_id_list) != len(kwargs_list):
        raise ValueError(f"{len(instruction_id_list)} instruction ids but {len(kwargs_list)} kwargs")
    if not instruction_id_list:
        raise ValueError("an IFEval prompt needs at least one instruction")
    # Build every checker before running any, so bad ids or kwargs always raise.
    checkers = [
        build_checker(instruction_id, kwargs)
        for instruction_id, kwargs in zip(instruction_id_list, kwargs_list, strict=True)
    ]
    variants = loose_variants(response)
    strict = [_follows(checker, response) for checker in checkers]
    # variants[0] is the response itself, already checked for `strict`.
    loose = [
        passed or any(_follows(checker, variant) for variant in variants[1:])
        for checker, passed in zip(checkers, strict, strict=True)
    ]
    return IFEvalResult(strict=strict, loose=loose)
