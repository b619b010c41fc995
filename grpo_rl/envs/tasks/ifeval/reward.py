"""IFEval rewards: the benchmark's strict and loose scores (Zhou et al., 2023, arXiv:2311.07911) as reward components.

One response is checked against its prompt's verifiable instructions by
:func:`grpo_rl.envs.tasks.ifeval.instructions.evaluate_response`, which gives four scores, each a reward component:

* ``prompt_strict`` / ``prompt_loose``: 1.0 when every instruction is followed (strict / loose), else 0.0;
* ``inst_strict`` / ``inst_loose``: the fraction of the prompt's instructions followed.

A reference is the data set row's ``{"instruction_id_list", "kwargs", "prompt"}``. Departures from the
benchmark, both optional:

* With ``answer_tags``, only the text inside the last ``<answer>...</answer>`` (stripped) is checked, so a
  policy may plan before answering; a response without a closed answer tag follows no instruction. A
  ``format`` component (:func:`answer_tag_format_reward`) then rewards the tags themselves.
* The components are weighted and summed, so prompt- and instruction-level signals can be mixed.

The four components share one evaluation per response (:class:`IFEvalScorer` caches the last batch), so
logging all of them costs no more than computing one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from grpo_rl.envs.rewards.base import RewardComponent
from grpo_rl.envs.tasks.ifeval.instructions import IFEvalResult, evaluate_response

__all__ = [
    "IFEVAL_SCORES",
    "IFEvalScorer",
    "answer_tag_format_reward",
    "answer_tag_text",
    "ifeval_components",
]

IFEVAL_SCORES = {
    "prompt_strict": lambda r: float(r.prompt_strict),
    "prompt_loose": lambda r: float(r.prompt_loose),
    "inst_strict": lambda r: r.inst_strict_frac,
    "inst_loose": lambda r: r.inst_loose_frac,
}


def answer_tag_text(response: str) -> str | None:
    """The stripped contents of the last closed ``<answer>...</answer>``, or None when there is none.

    Scanned with ``str.find`` rather than a regex so degenerate output (many unclosed tags) stays linear.
    """
    end = response.rfind("</answer>")
    if end == -1:
        return None
    start = response.rfind("<answer>", 0, end)
    if start == -1:
        return None
    return response[start + len("<answer>") : end].strip()


def answer_tag_format_reward(responses: Sequence[str], references: Sequence[Any], **_columns) -> list[float]:
    """1.0 for exactly one non-empty ``<answer>...</answer>`` that ends the response; 0.5 for any
    non-empty closed answer tag; else 0.0. Text before ``<answer>`` (a plan, ``<think>``) is allowed."""
    scores = []
    for response in responses:
        text = answer_tag_text(response)
        if not text:
            scores.append(0.0)
            continue
        single = response.count("<answer>") == 1 and response.count("</answer>") == 1
        ends = response.rstrip().endswith("</answer>")
        scores.append(1.0 if single and ends else 0.5)
    return scores


class IFEvalScorer:
    """Runs the IFEval checkers on a batch (with ``answer_tags``, the text inside the last ``<answer>...</answer>``)
    and remembers the last batch, so several components share it."""

    def __init__(self, *, answer_tags: bool = False):
        self.answer_tags = answer_tags
        self._key: tuple | None = None
        self._results: list[IFEvalResult] = []

    def evaluate(self, responses: Sequence[str], references: Sequence[Mapping[str, Any]]) -> list[IFEvalResult]:
        if len(responses) != len(references):
            raise ValueError(f"got {len(responses)} responses but {len(references)} references")
        key = tuple(
            (r, ref["prompt"], tuple(ref["instruction_id_list"])) for r, ref in zip(responses, references, strict=True)
        )
        if key != self._key:
            self._results = [self._evaluate_one(r, ref) for r, ref in zip(responses, references, strict=True)]
            self._key = key
        return self._results

    def _evaluate_one(self, response: str, reference: Mapping[str, Any]) -> IFEvalResult:
        text = response
        if self.answer_tags:
            text = answer_tag_text(response) or ""  # no answer: nothing to check, every instruction fails
        return evaluate_response(text, reference["instruction_id_list"], reference["kwargs"], reference["prompt"])

    def score(
        self, responses: Sequence[str], references: Sequence[Mapping[str, Any]], *, name: str, **_columns
    ) -> list[float]:
        """One of :data:`IFEVAL_SCORES` for every response."""
        return [IFEVAL_SCORES[name](r) for r in self.evaluate(responses, references)]


def ifeval_components(
    weights: Mapping[str, float], *, answer_tags: bool = False, format_weight: float = 0.0
) -> list[RewardComponent]:
    """The IFEval reward components: all four scores by ``weights`` (missing ones weigh 0 and are still logged)
    and, with ``answer_tags`` and a non-zero ``format_weight``, the answer-tag ``format`` component."""
    unknown = set(weights) - set(IFEVAL_SCORES)
    if unknown:
        raise ValueError(f"unknown IFEval reward component(s) {sorted(unknown)}; valid: {sorted(IFEVAL_SCORES)}")
    scorer = IFEvalScorer(answer_tags=answer_tags)
    components = [
        RewardComponent(name, partial(scorer.score, name=name), float(weights.get(name, 0.0))) for name in IFEVAL_SCORES
    ]
    if answer_tags and format_weight:
        components.append(RewardComponent("format", answer_tag_format_reward, format_weight))
    return components
