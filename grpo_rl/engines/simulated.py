"""The scale simulation's engine: sleeps for a batch's generation time and answers with random tokens
(:mod:`grpo_rl.training.simulated` has the whole story)."""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

import torch
from tensordict import TensorDict

from grpo_rl.engines.base import GroupRequest, SamplingSpec, check_room, pack_rollouts


def _sleep(seconds: float, jitter: float, rng: random.Random) -> float:
    took = max(0.0, seconds * (1.0 + jitter * rng.gauss(0.0, 1.0)))
    time.sleep(took)
    return took


class _Group:
    """One group in the simulated engine: its answers' relative lengths and seconds, and when each started and
    ended (inf: not yet) under which weights."""

    def __init__(self, request: GroupRequest, n: int, seconds: float, long_tail: float, jitter: float, rng):
        self.request, self.drawn = request, time.monotonic()
        self.shares = [math.exp(-long_tail * rng.expovariate(1.0)) for _ in range(n)]
        scale = max(0.0, seconds * (1.0 + jitter * rng.gauss(0.0, 1.0)))  # one draw of the spread for the group
        self.seconds = [scale * u for u in self.shares]
        self.starts = [0.0] * n
        self.ends = [math.inf] * n
        self.versions0 = [0] * n


class SimulatedEngine:
    """Sleeps ``seconds`` per batch, then answers every prompt with ``n`` random token sequences.

    Like a served engine it reports the version that sampled each token (``behavior_version``): an answer of
    relative length ``u`` samples its token ``t`` at ``(t + 1) / L * u`` of the batch's time, under the newest
    weights pushed by then (a push during the batch is an in-flight update).

    Args:
        seconds, jitter: the generation time of one batch and its relative spread.
        answer_tokens: tokens per answer (at most the call's ``max_new_tokens``; of the longest, with a long tail).
        long_tail: spread of answer lengths (``simulate.long_tail``); 0: all of ``answer_tokens``.
        max_num_seqs: answers run at once when streaming (None: ``max_in_flight`` groups' worth).
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        seconds: float,
        jitter: float,
        answer_tokens: int,
        pad_id: int,
        long_tail: float = 0.0,
        max_num_seqs: int | None = None,
    ):
        self.vocab_size, self.seconds, self.jitter = vocab_size, seconds, jitter
        self.answer_tokens, self.pad_id, self.long_tail = answer_tokens, pad_id, long_tail
        self.max_num_seqs = max_num_seqs
        self.rng = random.Random()  # fresh per process: replicas must not draw the same times
        self.version = 0
        self._pushes: list[tuple[float, int]] = []  # (time, version) of pushes, for the batch under way
        self._history: list[tuple[float, int]] = []  # (time, version) of the recent pushes, for stream()

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSpec) -> TensorDict:
        start, version0 = time.monotonic(), self.version
        self._pushes = []
        took = _sleep(self.seconds, self.jitter, self.rng)
        pushes = list(self._pushes)
        g = torch.Generator().manual_seed(sampling.seed or 0)
        longest = min(self.answer_tokens, sampling.max_new_tokens)
        shares = [math.exp(-self.long_tail * self.rng.expovariate(1.0)) for _ in range(len(prompts) * n)]
        shares = [u / max(shares) for u in shares]
        responses, versions = [], []
        for u in shares:
            length = max(1, round(longest * u))
            responses.append(torch.randint(0, self.vocab_size, (length,), generator=g).tolist())
            at = [start + took * u * (t + 1) / length for t in range(length)]  # when each token was sampled
            versions.append([max([version0] + [v for when, v in pushes if when <= a]) for a in at])
        logprobs = [[-1.0] * len(r) for r in responses]
        truncated = [len(r) == sampling.max_new_tokens for r in responses]
        return pack_rollouts(prompts, responses, logprobs, truncated, n, self.pad_id, versions=versions)

    def stream(
        self, requests: Iterable[GroupRequest], n: int, sampling: SamplingSpec, max_in_flight: int
    ) -> Iterator[tuple[int, TensorDict]]:
        """Continuous batching, simulated: up to ``max_num_seqs`` answers run at once, each for its own length (a
        full-length answer takes a batch's ``seconds``), the others wait in order of their group's draw and start as
        answers end; a group is yielded when its last answer ends, so a group of short answers comes back before a
        long one drawn earlier, and while a long answer runs the engine fills the other places with the next groups.
        """
        check_room(max_in_flight)
        pending, groups, order = iter(requests), {}, 0
        waiting: deque[tuple[int, int]] = deque()  # (group, answer) in the order drawn
        running: list[tuple[float, int, int]] = []  # heap of (end, group, answer)
        slots = self.max_num_seqs or max_in_flight * n
        longest = min(self.answer_tokens, sampling.max_new_tokens)

        def begin(at: float) -> None:  # start waiting answers in the free places, at time ``at``
            while waiting and len(running) < slots:
                o, i = waiting.popleft()
                group = groups[o]
                start = max(at, group.drawn)  # a place freed before the group came: it starts when it came
                group.starts[i], group.versions0[i] = start, self.version
                heapq.heappush(running, (start + group.seconds[i], o, i))

        while True:
            for request in islice(pending, max_in_flight - len(groups)):
                groups[order] = _Group(request, n, self.seconds, self.long_tail, self.jitter, self.rng)
                waiting.extend((order, i) for i in range(n))
                order += 1
            begin(time.monotonic())
            if not groups:
                return
            end, o, i = heapq.heappop(running)
            time.sleep(max(0.0, end - time.monotonic()))
            begin(end)  # the place this answer held goes to the next one waiting
            group = groups[o]
            group.ends[i] = end
            if math.inf in group.ends:
                continue
            del groups[o]
            yield group.request.key, self._pack(group, longest, sampling)

    def _pack(self, group: _Group, longest: int, sampling: SamplingSpec) -> TensorDict:
        g = torch.Generator().manual_seed(group.request.seed or 0)
        responses, versions = [], []
        for u, start, end, version0 in zip(group.shares, group.starts, group.ends, group.versions0, strict=True):
            length = max(1, round(longest * u))
            responses.append(torch.randint(0, self.vocab_size, (length,), generator=g).tolist())
            at = [start + (end - start) * (t + 1) / length for t in range(length)]  # when each token was sampled
            versions.append([max([version0] + [v for t, v in self._history if start < t <= a]) for a in at])
        logprobs = [[-1.0] * len(r) for r in responses]
        truncated = [len(r) == sampling.max_new_tokens for r in responses]
        return pack_rollouts(
            [group.request.prompt], responses, logprobs, truncated, len(responses), self.pad_id, versions
        )

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        for _ in named_tensors:  # the weights arrive (the transport is real); nothing is loaded
            pass
        self.version = self.version + 1 if version is None else version
        now = time.monotonic()
        self._pushes.append((now, self.version))
        self._history = [*self._history[-63:], (now, self.version)]  # recent pushes, for groups streamed

    def shutdown(self) -> None:
        """Nothing to release."""
