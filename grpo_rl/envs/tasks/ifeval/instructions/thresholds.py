"""Count thresholds of IFEval instructions: the relation and the number.

Reference: google-research `instruction_following_eval/instructions.py`
(`_COMPARISON_RELATION`). "less than" is a strict `<`; "at least" is `>=`, so
a count of exactly N passes "at least N" and fails "less than N".

Departure: where the reference meets a missing or negative number it draws a
random one (it was written to generate instructions as well as to check them);
here such a value raises `ValueError`, so a score never depends on chance.
"""

from __future__ import annotations

from typing import Literal, get_args

Relation = Literal["less than", "at least"]
RELATIONS: tuple[str, ...] = get_args(Relation)


def validate_relation(relation: object) -> Relation:
    """`relation` as a `Relation`; raises ValueError unless it is "less than" or "at least"."""
    if relation not in RELATIONS:
        raise ValueError(f"The supported relation for comparison must be in {RELATIONS}, but {relation!r} is given.")
    return relation  # type: ignore[return-value]


def validate_count(name: str, value: object, minimum: int = 0) -> int:
    """`value` as an int; raises ValueError (naming the kwarg `name`) unless it is a whole number >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():  # whole floats (3.0, as a dataframe holds) pass
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def compare(count: int, relation: Relation, threshold: int) -> bool:
    """Whether `count` satisfies `relation` to `threshold`: "less than" (`<`) or "at least" (`>=`)."""
    if relation == "less than":
        return count < threshold
    return count >= threshold
