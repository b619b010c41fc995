"""Example reward functions for examples/prompts.jsonl (short questions with one right answer).

Run them in training with:

    python sota/grpo.py env.dataset=file env.path=examples/prompts.jsonl \
        'reward.functions=[{path: examples/custom_reward.py, name: contains_answer, weight: 1.0},
                           {path: examples/custom_reward.py, name: brevity, weight: 0.2}]'

Every function takes ``(responses, references, **columns)`` and returns one float per response:
``references`` is the ``ground_truth`` column, and each other column arrives as a keyword list aligned with
``responses`` (a function names the ones it needs, such as ``max_words`` below, or takes ``**columns``).
"""
from __future__ import annotations

import re


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def contains_answer(responses: list[str], references: list[str], **columns) -> list[float]:
    """1.0 when the reference answer appears in the response as whole words (case-insensitive), else 0.0."""
    scores = []
    for response, reference in zip(responses, references, strict=True):
        want = _words(reference)
        got = _words(response)
        found = any(got[i : i + len(want)] == want for i in range(len(got) - len(want) + 1))
        scores.append(1.0 if want and found else 0.0)
    return scores


def brevity(responses: list[str], references: list[str], max_words: list[int]) -> list[float]:
    """1.0 for a response within the row's ``max_words``; shrinks as ``max_words / words`` beyond it."""
    scores = []
    for response, limit in zip(responses, max_words, strict=True):
        n = len(response.split())
        scores.append(1.0 if n <= limit else limit / n)
    return scores
