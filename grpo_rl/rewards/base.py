"""Reward functions and their weighted combination.

A reward function is a plain callable ``(responses, references) -> list[float]``: one number per response,
``references[i]`` being whatever the task knows about prompt ``i``'s answer (a GSM8K answer string, an IFEval
instruction list, a user's ``ground_truth``). Rule-based rewards are therefore testable without a model.

:class:`CompositeReward` combines named components with weights and keeps each component, so every one
can be logged separately. A component that raises, returns a non-number or the wrong count does not end the
run: the affected samples get ``fallback`` for that component, the failure is counted and recorded with the
offending sample, and only a step in which every sample failed raises.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

log = logging.getLogger(__name__)

RewardFn = Callable[[Sequence[str], Sequence[Any]], Sequence[float]]


class RewardError(RuntimeError):
    """Every sample of a step failed in a reward function."""


@dataclass
class RewardComponent:
    name: str
    fn: RewardFn
    weight: float = 1.0


@dataclass
class RewardResult:
    """``total``: ``[N]`` weighted sum; ``components``: name -> ``[N]`` unweighted values; ``failures``: name -> count."""

    total: torch.Tensor
    components: dict[str, torch.Tensor]
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: list[dict] = field(default_factory=list)


class CompositeReward:
    """A weighted sum of named reward components with per-sample failure isolation.

    Args:
        components: the reward functions with their names and weights.
        fallback: reward given to a sample whose component failed.
    """

    def __init__(self, components: Sequence[RewardComponent], *, fallback: float = 0.0):
        if not components:
            raise ValueError("a reward needs at least one component")
        self.components = list(components)
        self.fallback = fallback

    def __call__(self, responses: Sequence[str], references: Sequence[Any], **extra: Sequence[Any]) -> RewardResult:
        n = len(responses)
        total = torch.zeros(n, dtype=torch.float32)
        values: dict[str, torch.Tensor] = {}
        failures: dict[str, int] = {}
        examples: list[dict] = []
        for comp in self.components:
            vals, failed, errors = self._evaluate(comp, responses, references, extra)
            if failed == n and n > 0:
                raise RewardError(f"reward {comp.name!r} failed on every sample of the step: {errors[0]}")
            if failed:
                failures[comp.name] = failed
                examples.extend(errors[:3])
                log.warning("reward %r failed on %d/%d samples; first: %s", comp.name, failed, n, errors[0])
            values[comp.name] = vals
            total += comp.weight * vals
        return RewardResult(total=total, components=values, failures=failures, failure_examples=examples)

    def _evaluate(self, comp: RewardComponent, responses, references, extra) -> tuple[torch.Tensor, int, list[dict]]:
        """Call the component on the batch; on failure, retry sample by sample to isolate the bad ones."""
        n = len(responses)
        try:
            out = comp.fn(responses, references, **extra) if extra else comp.fn(responses, references)
            return self._check(comp.name, out, n), 0, []
        except Exception as batch_error:  # noqa: BLE001 - a user's function may raise anything
            if n == 1:
                return (torch.full((1,), self.fallback), 1,
                        [{"reward": comp.name, "error": repr(batch_error), "response": responses[0]}])
        vals = torch.full((n,), self.fallback, dtype=torch.float32)
        errors: list[dict] = []
        for i in range(n):
            try:
                one_extra = {k: [v[i]] for k, v in extra.items()}
                out = comp.fn([responses[i]], [references[i]], **one_extra) if extra else comp.fn([responses[i]], [references[i]])
                vals[i] = self._check(comp.name, out, 1)[0]
            except Exception as e:  # noqa: BLE001
                errors.append({"reward": comp.name, "index": i, "error": repr(e), "response": responses[i]})
        return vals, len(errors), errors

    @staticmethod
    def _check(name: str, out: Any, n: int) -> torch.Tensor:
        out = list(out) if not isinstance(out, torch.Tensor) else out.tolist()
        if len(out) != n:
            raise ValueError(f"reward {name!r} returned {len(out)} values for {n} responses")
        vals = []
        for v in out:
            if not isinstance(v, (int, float)) or not math.isfinite(float(v)):
                raise TypeError(f"reward {name!r} returned {v!r}; it must return finite numbers")
            vals.append(float(v))
        return torch.tensor(vals, dtype=torch.float32)
