"""Where the learner's batches come from: the rollout-source protocol, the in-process source of the synchronous
loop, and the bookkeeping that makes every source resume exactly once.

Both loops ask a :class:`RolloutSource` for ``next_batch(version)``: ``sota/grpo.py`` an
:class:`InProcessRollouts` (collect with the engine in this process, now), ``sota/grpo-async.py`` an
:class:`~grpo_rl.distributed.pipeline.AsyncRollouts` (the buffer fed by collector actors). The run lifecycle
checkpoints and restores a source through ``state_dict``/``load_state_dict`` and logs what it returns; it never
looks behind the protocol.

**Batch indices, and exactly once.** The prompt stream is a seeded sequence of batches: batch ``b`` holds the
prompts the environment hands out at its ``b``-th reset, and its answers are sampled with the seed of step ``b``.
Every collected batch carries its index (key ``batch_index``, ``[N]``). :class:`StreamPosition` records which
indices the learner has consumed (trained on, or dropped by the staleness gate): every index below a watermark
``next_index``, plus the consumed ones above it (collector replicas finish out of order). A checkpoint holds that
record and the environment's state at the watermark, so a resumed run regenerates exactly the batches that were
not consumed (those in the buffer, or being generated, when the run stopped) and never one that was.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from tensordict import TensorDict

from grpo_rl.errors import RoleFailed
from grpo_rl.rollout.collector import Collector
from grpo_rl.rollout.evaluation import Evaluator


@dataclass
class Rollout:
    """One step's batch and what the rollout side measured while making it.

    Attributes:
        batch: the scored batch, ``[N]`` (see :mod:`grpo_rl.rollout.collector` for the keys, plus ``batch_index``).
        metrics: rollout-side metrics of this step, under the names both loops log.
        failure_examples: failing reward calls (component, error, answer), for ``reward_failures.jsonl``.
    """

    batch: TensorDict
    metrics: dict[str, float]
    failure_examples: list[dict] = field(default_factory=list)


class RolloutSource(Protocol):
    """Hands the learner the next scored batch for its policy version, and evaluates the policy its engines hold."""

    def next_batch(self, version: int, should_stop: Callable[[], bool] = lambda: False) -> Rollout | None:
        """The next batch to train on at learner ``version``; None when ``should_stop()`` turned true while the
        source waited."""
        ...

    def evaluate(self, step: int, last_step: int) -> dict[str, float]:
        """Held-out ``eval/*`` metrics of the weights the engines hold (``eval.every``; empty when not due)."""
        ...

    def state_dict(self) -> dict:
        """What a checkpoint needs to resume the stream exactly once (see :class:`StreamPosition`)."""
        ...

    def load_state_dict(self, state: dict) -> None: ...

    def rewind(self) -> None:
        """Drop whatever was collected ahead, so that :meth:`load_state_dict` can take the stream back to a
        checkpoint's position."""
        ...

    def close(self) -> None: ...


class StreamPosition:
    """Which batches of the prompt stream were consumed, and the state of ``env`` (an environment of the run at the
    start of the stream) at the first one that was not."""

    def __init__(self, env):
        self.env = env
        self.next_index = 0
        self.consumed: set[int] = set()

    def consume(self, indices) -> None:
        """Mark batch ``indices`` consumed; move the watermark over every consumed index in a row."""
        for b in indices:
            b = int(b)
            if b < self.next_index or b in self.consumed:
                raise RuntimeError(f"batch {b} of the prompt stream was handed out twice")
            self.consumed.add(b)
        while self.next_index in self.consumed:
            self.consumed.remove(self.next_index)
            self.env.reset()  # a few list lookups, no tokenisation; only the env's state_dict is used
            self.next_index += 1

    def state_dict(self) -> dict:
        return {**self.env.state_dict(), "next_index": self.next_index, "consumed": sorted(self.consumed)}

    def load_state_dict(self, state: dict) -> None:
        self.env.load_state_dict(state)
        self.next_index = int(state.get("next_index", 0))
        self.consumed = set(int(b) for b in state.get("consumed", ()))


def batch_indices(batch: TensorDict) -> list[int]:
    """The distinct ``batch_index`` values of ``batch``'s rows, in order."""
    return sorted(set(batch["batch_index"].tolist())) if batch.batch_size[0] else []


class InProcessRollouts:
    """The synchronous loop's source: collect batch ``b`` with ``collector`` when asked, with the current weights.

    Args:
        evaluator: the held-out evaluation on the same engine, or None (``eval.every=0``).
        heal: called with the :class:`~grpo_rl.errors.RoleFailed` of a collection that failed; True when it put
            the engine right, and the batch is then collected again. None: the failure ends the run.
    """

    def __init__(
        self, collector: Collector, evaluator: Evaluator | None = None, heal: Callable[[RoleFailed], bool] | None = None
    ):
        self.collector = collector
        self.evaluator = evaluator
        self.heal = heal
        self.position = StreamPosition(collector.env)

    def next_batch(self, version: int, should_stop: Callable[[], bool] = lambda: False) -> Rollout:
        """Collect the next batch now (``should_stop`` is not consulted: nothing here waits)."""
        index = self.position.next_index
        t0 = time.perf_counter()
        batch, cs = self._collect(index, version)
        batch.set("batch_index", torch.full((batch.batch_size[0],), index, dtype=torch.long))
        self.position.next_index += 1  # the collector's env is the position's env: nothing to skip
        metrics = {
            "generation_seconds": cs.generation_seconds,
            "reward_seconds": cs.reward_seconds,
            "reward_failures": float(sum(cs.reward_failures.values())),
            "generation_tokens_per_second": cs.num_tokens / max(cs.generation_seconds, 1e-9),
            "collect_seconds": time.perf_counter() - t0,
        }
        return Rollout(batch=batch, metrics=metrics, failure_examples=list(cs.failure_examples))

    def _collect(self, index: int, version: int):
        """Batch ``index``, leaving the environment past it (also when a failed attempt is healed and made again)."""
        env_state = copy.deepcopy(self.collector.env.state_dict())
        while True:
            try:
                return self.collector.collect(index, version)
            except RoleFailed as e:
                if self.heal is None or not self.heal(e):
                    raise
                self.collector.env.load_state_dict(copy.deepcopy(env_state))

    def evaluate(self, step: int, last_step: int) -> dict[str, float]:
        return {} if self.evaluator is None else self.evaluator.maybe_evaluate(step, last_step)

    def state_dict(self) -> dict:
        return self.position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state.get("consumed"):
            raise ValueError(
                f"this checkpoint's stream has batches {state['consumed']} consumed past its position "
                f"{state['next_index']}; the synchronous loop reads the stream in order. Resume it with "
                "sota/grpo-async.py"
            )
        self.position.load_state_dict(state)

    def rewind(self) -> None:
        """Nothing is collected ahead."""

    def close(self) -> None:
        """Nothing to stop: the engine is shut down by its owner."""
