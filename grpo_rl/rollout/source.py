"""Where the learner's batches come from: the rollout-source protocol, the in-process source of the synchronous
loop, and the bookkeeping that makes every source resume exactly once.

Both loops ask a :class:`RolloutSource` for ``next_batch(version)``: ``sota/grpo.py`` an
:class:`InProcessRollouts` (collect with the engine in this process, now), ``sota/grpo-async.py`` an
:class:`~grpo_rl.distributed.pipeline.AsyncRollouts` (the buffer fed by collector actors). The run lifecycle
checkpoints and restores a source through ``state_dict``/``load_state_dict`` and logs what it returns; it never
looks behind the protocol.

**Group indices, and exactly once.** The prompt stream is a seeded sequence of groups: group ``g`` is prompt
``g % P`` of the environment's ``g // P``-th reset (``P = env.prompts_per_step``), its answers sampled with the seed of
batch ``g // P`` (:meth:`~grpo_rl.rollout.collector.Collector.stream`), so the synchronous loop's step ``b`` trains
on groups ``b * P .. b * P + P - 1`` as it always did. Every collected group carries its index (key
``group_index``, and ``batch_index = g // P``). :class:`StreamPosition` records which groups the learner has consumed
(trained on, dropped by the staleness gate or by dynamic sampling): every index below a watermark ``next_group``,
plus the consumed ones above it (groups finish out of order). A checkpoint holds that record and the environment's
state at the watermark's batch, so a resumed run regenerates exactly the groups that were not consumed (those in the
buffer, or being generated, when the run stopped) and never one that was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from tensordict import TensorDict

from grpo_rl.engines.base import Live, concat_batches
from grpo_rl.errors import RoleFailed
from grpo_rl.rollout.collector import Collector, PromptGroups
from grpo_rl.rollout.dynamic_sampling import DynamicSampling
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
    """Which groups of the prompt stream were consumed, and the state of the environment at the start of the batch
    of the first one that was not.

    Args:
        env: an environment of the run at the start of the stream; the position moves it (it is its scratch copy:
            a synchronous loop's collector may share it, since the two never use it at the same time).
    """

    def __init__(self, env):
        self.env = env
        self.per_batch = env.prompts_per_step
        self.next_group = 0
        self.consumed: set[int] = set()
        self._env_state = dict(env.state_dict())
        self._env_batch = 0  # the batch _env_state stands at: next_group // per_batch

    def consume(self, groups) -> None:
        """Mark ``groups`` consumed; move the watermark over every consumed index in a row."""
        for g in groups:
            g = int(g)
            if g < self.next_group or g in self.consumed:
                raise RuntimeError(f"group {g} of the prompt stream was handed out twice")
            self.consumed.add(g)
        while self.next_group in self.consumed:
            self.consumed.remove(self.next_group)
            self.next_group += 1
        batch = self.next_group // self.per_batch
        if batch > self._env_batch:
            self.env.load_state_dict(self._env_state)
            for _ in range(batch - self._env_batch):
                self.env.reset()  # a few list lookups, no tokenisation; only the env's state is kept
            self._env_state, self._env_batch = dict(self.env.state_dict()), batch

    def prompts(self, env) -> PromptGroups:
        """The stream's prompts from the watermark's batch on, drawn from ``env`` (moved there)."""
        env.load_state_dict(self._env_state)
        return PromptGroups(env, self._env_batch)

    def owed(self, replica: int = 0, num_replicas: int = 1) -> Iterator[int]:
        """The groups not consumed from the watermark on (as of now), those of ``replica`` of ``num_replicas``."""
        return owed_groups(self.state_dict(), replica, num_replicas)

    def state_dict(self) -> dict:
        return {**self._env_state, "next_group": self.next_group, "consumed_groups": sorted(self.consumed)}

    def load_state_dict(self, state: dict) -> None:
        """A position of :meth:`state_dict`, or one from before groups were the unit (``next_index`` and
        ``consumed`` count whole batches)."""
        p = self.per_batch
        self.env.load_state_dict(state)
        if "next_group" in state:
            self.next_group = int(state["next_group"])
            self.consumed = {int(g) for g in state.get("consumed_groups", ())}
        else:
            self.next_group = int(state.get("next_index", 0)) * p
            self.consumed = {int(b) * p + i for b in state.get("consumed", ()) for i in range(p)}
        self._env_state, self._env_batch = dict(self.env.state_dict()), self.next_group // p
        self.consume(())  # a watermark followed by consumed groups moves over them


def owed_groups(position: dict | None, replica: int = 0, num_replicas: int = 1) -> Iterator[int]:
    """The stream's group indices from ``position`` (a :meth:`StreamPosition.state_dict`; None: the start) on that
    were not consumed, those ``g`` with ``g % num_replicas == replica``."""
    g = int(position.get("next_group", 0)) if position else 0
    consumed = set(position.get("consumed_groups", ())) if position else set()
    while True:
        if g % num_replicas == replica and g not in consumed:
            yield g
        g += 1


class InProcessRollouts:
    """The synchronous loop's source: collect the next ``P`` groups with ``collector`` when asked, with the current
    weights, all ``P`` in flight on the engine at once.

    Args:
        evaluator: the held-out evaluation on the same engine, or None (``eval.every=0``).
        heal: called with the :class:`~grpo_rl.errors.RoleFailed` of a collection that failed; True when it put
            the engine right, and the step's groups are then collected again. None: the failure ends the run.
        dynamic: DAPO's dynamic sampling: a group whose rewards are all equal is dropped when it finishes and the
            next prompt starts in its place at once, until ``P`` groups vary or the rule's draws are spent.
    """

    def __init__(
        self,
        collector: Collector,
        evaluator: Evaluator | None = None,
        heal: Callable[[RoleFailed], bool] | None = None,
        dynamic: DynamicSampling | None = None,
    ):
        self.collector = collector
        self.evaluator = evaluator
        self.heal = heal
        self.dynamic = dynamic
        self.pad_id = collector.tokenizer.pad_token_id or 0
        self.position = StreamPosition(collector.env)

    def next_batch(self, version: int, should_stop: Callable[[], bool] = lambda: False) -> Rollout:
        """Collect the next step's groups now (``should_stop`` is not consulted: nothing here waits)."""
        t0 = time.perf_counter()
        while True:
            try:
                kept, flat, stats = self._collect(version)
                break
            except RoleFailed as e:
                if self.heal is None or not self.heal(e):
                    raise
        self.position.consume(g for g, _ in kept + flat)
        generation = sum(cs.generation_seconds for cs in stats)
        metrics = {
            "generation_seconds": generation,
            "reward_seconds": sum(cs.reward_seconds for cs in stats),
            "reward_failures": float(sum(sum(cs.reward_failures.values()) for cs in stats)),
            "generation_tokens_per_second": sum(cs.num_tokens for cs in stats) / max(generation, 1e-9),
            "collect_seconds": time.perf_counter() - t0,
        }
        groups = lambda pairs: [group for _, group in sorted(pairs, key=lambda pair: pair[0])]  # noqa: E731
        if self.dynamic is None:
            batch = concat_batches(groups(kept), self.pad_id)
        else:
            batch, extra = self.dynamic.step_batch(groups(kept), groups(flat), self.pad_id)
            metrics.update(extra)
        failures = [example for cs in stats for example in cs.failure_examples]
        return Rollout(batch=batch, metrics=metrics, failure_examples=failures)

    def _collect(self, version: int):
        """The step's groups from the watermark on: ``P`` of them in flight; with dynamic sampling, each flat one is
        replaced as it finishes. Returns ``(kept, flat, stats)``, ``(g, group)`` pairs and each group's stats."""
        P = self.position.per_batch
        limit = P if self.dynamic is None else self.dynamic.max_draws
        owed = self.position.owed()
        kept, flat, stats, drawn, in_flight = [], [], [], 0, 0

        def draw() -> int | None:
            nonlocal drawn, in_flight
            if drawn >= limit or len(kept) + in_flight >= P:  # the step has, or will have, all it needs
                return None
            drawn, in_flight = drawn + 1, in_flight + 1
            return next(owed)

        prompts = self.position.prompts(self.collector.env)
        for g, group, cs in self.collector.stream(Live(draw), prompts, lambda: version, max_in_flight=P):
            in_flight -= 1
            stats.append(cs)
            (kept if self.dynamic is None or self.dynamic.keep(group) else flat).append((g, group))
        return kept, flat, stats

    def evaluate(self, step: int, last_step: int) -> dict[str, float]:
        return {} if self.evaluator is None else self.evaluator.maybe_evaluate(step, last_step)

    def state_dict(self) -> dict:
        return self.position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.position.load_state_dict(state)  # groups consumed past the watermark (an async run's) are skipped

    def rewind(self) -> None:
        """Nothing is collected ahead."""

    def close(self) -> None:
        """Nothing to stop: the engine is shut down by its owner."""
