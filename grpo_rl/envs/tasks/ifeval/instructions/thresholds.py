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
    """Returns `relation` unchanged if it is one the reference supports.

    Args:
        relation: The relation from the data's `kwargs`.

    Returns:
        The same string, typed as a `Relation`.

    Raises:
        ValueError: `relation` is not "less than" or "at least".
    """
    if relation not in RELATIONS:
        raise ValueError(f"The supported relation for comparison must be in {RELATIONS}, but {relation!r} is given.")
    return relation  # type: ignore[return-value]


def validate_count(name: str, value: object, minimum: int = 0) -> int:
    """Returns `value` as an int if it is a whole number >= `minimum`.

    Whole floats (`3.0`, as a dataframe may hold them) are accepted.

    Args:
        name: The kwarg's name, for the error message.
        value: The kwarg's value.
        minimum: The smallest allowed value.

    Returns:
        `value` as an int.

    Raises:
        ValueError: `value` is not a whole number, or is below `minimum`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def compare(count: int, relation: Relation, threshold: int) -> bool:
    """Applies `relation` between an observed count and the threshold.

    Args:
        count: What was counted in the response.
        relation: "less than" (`count < threshold`) or "at least"
            (`count >= threshold`).
        threshold: The number from the instruction.

    Returns:
        Whether the count satisfies the relation.
    """
    if relation == "less than":
        return count < threshold
    return count >= threshold
