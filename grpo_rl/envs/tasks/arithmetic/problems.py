"""The arithmetic task's problems, generated from a seed in GSM8K's record layout.

A problem such as ``What is 47 + 38?`` is the record ``{"question": ..., "answer": "47 + 38 = 85\\n#### 85"}``,
so GSM8K's prompt templates and reward (the final number's correctness plus the ``#### N`` format,
:mod:`grpo_rl.envs.tasks.gsm8k.reward`) apply unchanged, with or without the calculator tool. The difficulty is set
by the operations and the operands' digits (``env.arithmetic``; benchmarks/learning/arithmetic_probe.py measures the
base model's accuracy per setting).

Each split is drawn from a seed of its own. Within a split the questions are distinct, and the train split
never holds a question among the first ``held_out`` of the test stream, so every test split of up to
``held_out`` problems (``env.arithmetic.test_size``) is disjoint from the train split; the test split of ``n``
problems is the first ``n`` of its stream, so held-out evaluation's first prompts are the same at every size.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from grpo_rl.errors import ConfigError

__all__ = ["OPERATIONS", "SPLITS", "ArithmeticSpec", "arithmetic_records", "problem_count"]

OPERATIONS = {"add": "+", "sub": "-", "mul": "*"}
"""Operation name -> the symbol in the question (``*`` as in the calculator tool's expressions)."""
SPLITS = ("train", "test")
MAX_DIGITS = 9


@dataclass(frozen=True)
class ArithmeticSpec:
    """Which problems are generated: ``add``/``sub`` of two ``digits``-digit operands (the larger first for ``sub``),
    ``mul`` of a ``digits``-digit by a ``mul_digits``-digit one; ``held_out`` test problems the train split avoids."""

    operations: tuple[str, ...] = ("add", "sub")
    digits: int = 2
    mul_digits: int = 1
    held_out: int = 500

    @classmethod
    def from_config(cls, arithmetic: Any) -> ArithmeticSpec:
        """From the ``env.arithmetic`` config group."""
        return cls(
            tuple(arithmetic.operations), int(arithmetic.digits), int(arithmetic.mul_digits), int(arithmetic.test_size)
        )


def _span(digits: int) -> tuple[int, int]:
    return (10 ** (digits - 1), 10**digits - 1)


def problem_count(spec: ArithmeticSpec) -> int:
    """How many distinct questions ``spec`` can generate."""
    n = 9 * 10 ** (spec.digits - 1)
    counts = {"add": n * n, "sub": n * (n + 1) // 2, "mul": n * 9 * 10 ** (spec.mul_digits - 1)}
    return sum(counts[op] for op in set(spec.operations))


def _problem(rng: random.Random, spec: ArithmeticSpec) -> tuple[str, int, int]:
    op = rng.choice(spec.operations)
    a = rng.randint(*_span(spec.digits))
    b = rng.randint(*_span(spec.mul_digits if op == "mul" else spec.digits))
    if op == "sub" and b > a:
        a, b = b, a
    return op, a, b


def _record(op: str, a: int, b: int) -> dict[str, str]:
    result = {"add": a + b, "sub": a - b, "mul": a * b}[op]
    expression = f"{a} {OPERATIONS[op]} {b}"
    return {"question": f"What is {expression}?", "answer": f"{expression} = {result}\n#### {result}"}


def _stream(split: str, seed: int, size: int, spec: ArithmeticSpec, exclude: frozenset[str] = frozenset()):
    """``size`` distinct records of ``split``'s seeded stream, skipping questions in ``exclude``."""
    available = problem_count(spec) - len(exclude)
    if size > available:
        raise ConfigError(
            f"env.arithmetic: {size} distinct {split} problems asked for, but {spec.operations} with "
            f"digits={spec.digits}, mul_digits={spec.mul_digits} give {available}"
            f"{' outside the test split' if exclude else ''}; lower env.arithmetic.{split}_size or "
            "allow more problems (env.arithmetic.digits, env.arithmetic.operations)"
        )
    rng = random.Random(f"grpo_rl.arithmetic/{split}/{seed}")  # str seeds are hashed with SHA-512: stable
    seen: set[str] = set()
    records = []
    while len(records) < size:
        record = _record(*_problem(rng, spec))
        if record["question"] in seen or record["question"] in exclude:
            continue
        seen.add(record["question"])
        records.append(record)
    return records


def arithmetic_records(split: str, *, seed: int, size: int, spec: ArithmeticSpec) -> list[dict[str, str]]:
    """``size`` generated problems of ``split``, the same for the same arguments: ``test`` the first distinct ones of
    the test stream, ``train`` distinct ones of its own stream that are not among the first ``spec.held_out`` tests.

    Raises:
        ConfigError: an unknown split, a test split larger than ``spec.held_out``, or more problems than ``spec``
            can generate.
    """
    if split not in SPLITS:
        raise ConfigError(f"env.split={split!r}: env.dataset=arithmetic has the splits {', '.join(SPLITS)}")
    if split == "test":
        if size > spec.held_out:
            raise ConfigError(
                f"env.arithmetic.test_size={spec.held_out}: {size} test problems asked for; raise "
                "env.arithmetic.test_size (the train split avoids only that many test problems)"
            )
        return _stream("test", seed, size, spec)
    held_out = frozenset(r["question"] for r in _stream("test", seed, spec.held_out, spec))
    return _stream("train", seed, size, spec, held_out)
