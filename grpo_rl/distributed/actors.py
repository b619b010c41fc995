"""The roles that run as Ray actors: the collector (engine + environment), the reference scorer and the buffer.

The classes are plain Python; :mod:`grpo_rl.distributed.pipeline` and :mod:`grpo_rl.distributed.reference_actors`
wrap them with ``ray.remote`` and the options of their role's :class:`~grpo_rl.placement.context.RolePlacement`. Each
receives its slice of the run context (:class:`~grpo_rl.placement.context.ActorSpec`) and builds its parts with the same
``make_*`` factories as the synchronous script. The collector is a threaded actor: its :meth:`CollectorWorker.run`
loop occupies one thread while ``set_weights``, ``receive_weights``, ``evaluate`` and ``stop`` are served by others;
the buffer's blocking ``put``/``take`` wait on a condition variable, not on the actor.

The collector's engine is in-process inside the actor (vLLM's side effects on its process, see
:mod:`grpo_rl.engines.vllm_engine`, stay inside the actor), or a vLLM server the actor drives over HTTP
(``inference_model.engine=vllm_server``, :mod:`grpo_rl.engines.served`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterator

from grpo_rl.quiet import quiet_logging, quiet_start

# An actor's process imports this module first: drop the known notices of the imports below before they print.
quiet_logging()

import torch

from grpo_rl import trace
from grpo_rl.distributed.buffer import RolloutBuffer
from grpo_rl.engines.base import Live, concat_batches
from grpo_rl.engines.build import make_engine
from grpo_rl.placement.context import ActorSpec
from grpo_rl.rollout.collector import PromptGroups, make_collector
from grpo_rl.rollout.evaluation import make_evaluator
from grpo_rl.rollout.source import owed_groups
from grpo_rl.training.build import make_ref_scorer
from grpo_rl.weights.sync import unpack_weights

# A collector's cumulative counters; each batch it puts carries them to the driver (see RolloutBuffer.put).
COLLECTOR_COUNTERS = (
    "groups",
    "samples",
    "tokens",
    "generation_seconds",
    "reward_seconds",
    "reward_failures",
    "busy_seconds",
    "wait_for_space_seconds",
    "weight_loads",
    "weight_load_seconds",
)


class CollectorWorker:
    """Generates and scores groups with its engine as fast as the buffer admits them: replica ``r`` of
    ``num_replicas`` collects the stream's groups ``g`` with ``g % num_replicas == r`` not consumed yet.

    Args:
        buffer: the buffer actor handle (anything with ``put(batch, timeout) -> bool``).
        poll_seconds: how often a blocked put wakes up to check for :meth:`stop`.
        timeout: seconds a call to the buffer may take (``pipeline.timeout_seconds``).
    """

    def __init__(
        self, spec: ActorSpec, buffer, *, num_replicas: int = 1, poll_seconds: float = 1.0, timeout: float = 600.0
    ):
        quiet_start()  # each actor is a process of its own: the same quiet start as the driver
        self.run_ctx = spec.enter()
        self.engine = make_engine(self.run_ctx)
        self.collector = make_collector(self.run_ctx, self.engine)
        self.buffer = buffer
        self.replica, self.num_replicas = spec.index, num_replicas
        self.poll_seconds, self.timeout = poll_seconds, timeout
        self.version = 0
        self._pending = None  # newest (version, weights) not yet loaded
        self._pending_lock = threading.Lock()  # held only for a moment: set_weights never waits for generation
        self._engine_lock = threading.Lock()  # vLLM is not thread-safe: one engine call at a time
        self.inflight = self.run_ctx.cfg.pipeline.inflight_updates and (
            self.run_ctx.placement.served or self.run_ctx.cfg.simulate.enabled
        )
        self._push_lock = threading.Lock()  # in-flight pushes, one at a time, beside the generation
        self._push_error: BaseException | None = None  # an in-flight push that failed, raised by the loop
        self._receiver = None  # the collective transport's receiving end (connect_collective)
        self._stop = threading.Event()
        # time.monotonic() of the engine call under way: past pipeline.timeout_seconds the driver replaces this one
        self._engine_call_started: float | None = None
        self._stats = dict.fromkeys(COLLECTOR_COUNTERS, 0)
        self.whole_batches = self.run_ctx.cfg.pipeline.whole_batches
        self.groups_in_flight = self.run_ctx.cfg.pipeline.groups_in_flight
        self._pad_id = self.run_ctx.tokenizer.pad_token_id or 0
        self._evaluating = threading.Event()  # an evaluation waits for the engine: the stream drains
        self._outbox: list = []  # finished groups the buffer had no room for yet: (batch, failure examples, group)
        self.evaluator = make_evaluator(self.run_ctx, self.engine) if self.replica == 0 else None

    def ready(self) -> int:
        """This actor's process id (the driver records it in ``processes.json``)."""
        return os.getpid()

    def node(self) -> str:
        """The Ray node this actor runs on (named when a lost node takes it)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def engine_call_seconds(self) -> float:
        """How long the engine call under way has run (0 when none is)."""
        started = self._engine_call_started
        return 0.0 if started is None else time.monotonic() - started

    def set_weights(self, packet) -> None:
        """Queue new weights, loaded before the next generation call (the newest packet wins), or with in-flight
        updates push them to the server at once."""
        if self.inflight:  # a served engine takes them under the answers it is generating
            with self._push_lock:
                if packet.version > self.version:
                    try:
                        self._load((packet.version, packet))
                    except Exception as e:  # noqa: BLE001 - the collector's loop raises it: the collector is replaced
                        self._push_error = e
            return
        with self._pending_lock:
            if self._pending is None or packet.version >= self._pending[0]:
                self._pending = (packet.version, packet)

    def connect_collective(self, address: str, port: int, world_size: int) -> None:
        """Join the learner's weight broadcast group as rank ``1 + replica`` (``weight_transport=collective``)."""
        from grpo_rl.weights.collective import WeightBroadcast

        self._receiver = WeightBroadcast.connect(
            address, port, 1 + self.replica, world_size, self.run_ctx.devices.inference[0], self.timeout
        )

    def receive_weights(self) -> int:
        """Receive one broadcast (the learner sends at the same time) and queue it like :meth:`set_weights`."""
        version, named = self._receiver.receive()
        with self._pending_lock:
            self._pending = (version, named)
        return version

    def evaluate(self, step: int, last_step: int) -> dict[str, float]:
        """Held-out evaluation (``eval`` config group) with the newest weights pushed, between two generation
        calls; ``eval/policy_version`` says which."""
        if self.evaluator is None:
            return {}
        self._evaluating.set()
        try:
            with self._engine_lock:
                self._load_pending_weights()
                return {**self.evaluator.maybe_evaluate(step, last_step), "eval/policy_version": self.version}
        finally:
            self._evaluating.clear()

    def _load_pending_weights(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._load(pending)

    def _load(self, pending) -> None:
        version, weights = pending
        t0 = time.perf_counter()
        with trace.span("load weights", track="engine", version=version):
            weights = weights if isinstance(weights, list) else unpack_weights(weights)
            self.engine.update_weights(weights, version=version)
        self.version = version
        self._stats["weight_loads"] += 1
        self._stats["weight_load_seconds"] += time.perf_counter() - t0

    def run(self, position: dict | None = None) -> dict:
        """Collect until :meth:`stop` from the stream ``position`` (a :class:`~grpo_rl.rollout.source.StreamPosition`
        state dict; None: the start): up to ``pipeline.groups_in_flight`` (default ``P``) groups in flight on the
        engine, each started once the buffer admits it and put in the buffer the moment it is scored (with
        ``pipeline.whole_batches``, ``P`` at a time, put together when the last of them is done)."""
        env = self.collector.env
        if position is not None:
            env.load_state_dict(position)
        per_batch = env.prompts_per_step
        prompts = PromptGroups(env, int(position.get("next_group", 0)) // per_batch if position else 0)
        draws = _AdmittedGroups(self, owed_groups(position, self.replica, self.num_replicas), per_batch)
        together: list = []
        with self._engine_lock:
            room = self.groups_in_flight or per_batch
            stream = self.collector.stream(Live(draws.draw), prompts, lambda: self.version, room)
            self._engine_call_started = time.monotonic()
            try:
                for g, group, cs in stream:
                    draws.in_flight -= 1
                    self._count(group, cs)
                    together.append(group)
                    if self.whole_batches and draws.in_flight:
                        continue
                    self._outbox.append((concat_batches(together, self._pad_id), cs.failure_examples, g))
                    together = []
                    self._deliver(wait=not draws.in_flight)
                    if self._stop.is_set():
                        break
                    self._engine_call_started = time.monotonic() if draws.in_flight else None
            finally:
                stream.close()
                self._engine_call_started = None
        trace.flush()
        return self.stats()

    def _count(self, group, cs) -> None:
        st = self._stats
        st["groups"] += 1
        st["samples"] += group.batch_size[0]
        st["tokens"] += cs.num_tokens
        st["generation_seconds"] += cs.generation_seconds
        st["reward_seconds"] += cs.reward_seconds
        st["reward_failures"] += sum(cs.reward_failures.values())
        st["busy_seconds"] += cs.generation_seconds + cs.reward_seconds

    def _deliver(self, wait: bool) -> None:
        """Put the finished groups in the buffer, in the order they finished, their counters and failing reward
        calls with them. ``wait`` (no group in flight): wait for space, with the engine lock released (evaluation and
        weight loads go on meanwhile); else put what fits now and keep the rest (nothing new is drawn meanwhile, see
        :class:`_AdmittedGroups`): the engine must not be handed to an evaluation with groups in flight."""
        import ray

        t0, w0 = time.perf_counter(), trace.now_us()
        if wait:
            self._engine_lock.release()
            self._engine_call_started = None  # a wait for space is no engine call that could hang
        try:
            while self._outbox and not self._stop.is_set():
                batch, failure_examples, g = self._outbox[0]
                report = {f"collector/{self.replica}": self.stats()}
                timeout = self.poll_seconds if wait else 0.0
                put = self.buffer.put.remote(batch, timeout, report, failure_examples)
                if ray.get(put, timeout=self.timeout + timeout):
                    self._outbox.pop(0)
                elif not wait:
                    break
                elif ray.get(self.buffer.is_closed.remote(), timeout=self.timeout):  # shutting down: nobody reads
                    self._stop.set()
        finally:
            if wait:
                self._engine_lock.acquire()
        self._stats["wait_for_space_seconds"] += time.perf_counter() - t0
        trace.record("wait for space", w0, trace.now_us())

    def _admitted(self, index: int | list[int], wait: bool = True) -> bool:
        """Whether the buffer admits group ``index`` (or the groups ``index``, together) generated with the newest
        weights (they are loaded while waiting, so a push that lands meanwhile counts). ``wait``: until it does, or
        the collector stops (False); else ask once."""
        import ray

        while not self._stop.is_set():
            # An in-flight push that failed leaves the version where it was, so admission may never come: raised here,
            # the collector is replaced at once instead of waiting for weights that cannot land.
            if self._push_error is not None:
                raise self._push_error
            if wait:
                with self._engine_lock:
                    self._load_pending_weights()
            timeout = self.poll_seconds if wait else 0.0
            if ray.get(self.buffer.admit.remote(index, self.version, timeout), timeout=self.timeout + timeout):
                return True
            if not wait:
                return False
            if ray.get(self.buffer.is_closed.remote(), timeout=self.timeout):
                self._stop.set()
        return False

    def stats(self) -> dict:
        return {**self._stats, "version": self.version, "replica": self.replica}

    def stop(self) -> None:
        self._stop.set()

    def rearm(self) -> None:
        """After :meth:`stop`, when the stream is taken back to a checkpoint: let :meth:`run` be called again and
        take the checkpoint's (older) weights when pushed."""
        self._stop.clear()
        self._push_error = None
        self._outbox.clear()  # groups of the stream that is being taken back: made again
        self.version = -1

    def shutdown(self) -> None:
        self._stop.set()
        trace.flush()
        with self._engine_lock:
            self.engine.shutdown()
        if self._receiver is not None:
            self._receiver.close()


class _AdmittedGroups:
    """A collector's live request stream: its owed groups, each drawn once the buffer admits it.

    Drawn by the engine's stream on the collector's loop thread, which holds the engine lock; with no group in
    flight it releases the lock while it waits for admission, so that evaluation and weight loads take their turn.
    With groups in flight it never waits: it asks the buffer (after a no, not again for :attr:`ASK_SECONDS`) and has
    nothing while the answer is no, while weights wait to be loaded (without in-flight updates an engine's weights
    change only between its groups) or an evaluation waits, or, with whole batches, until the batch is done (whose
    ``P`` groups are admitted together).
    """

    ASK_SECONDS = 0.05

    def __init__(self, worker: CollectorWorker, owed: Iterator[int], per_batch: int):
        self.worker, self.owed, self.per_batch = worker, owed, per_batch
        self.in_flight = 0
        self._ready: deque[int] = deque()
        self._next: list[int] = []  # owed groups not admitted yet
        self._refused = -float("inf")  # time.monotonic() of the last admission refused

    def draw(self) -> int | None:
        w = self.worker
        if w._stop.is_set():
            return None
        if not self._ready:
            busy = w.whole_batches or w._pending is not None or w._evaluating.is_set() or w._outbox
            if self.in_flight and busy:
                return None  # drain first
            self._admit_some()
        if not self._ready:
            return None
        self.in_flight += 1
        return self._ready.popleft()

    def _admit_some(self) -> None:
        w = self.worker
        want = self.per_batch if w.whole_batches else 1
        while len(self._next) < want:  # a whole batch's groups are admitted together
            self._next.append(next(self.owed))
        ask = self._next if w.whole_batches else self._next[0]
        if self.in_flight:  # the engine is busy: ask, never wait (and not again at once after a no)
            if time.monotonic() - self._refused < self.ASK_SECONDS:
                return
            if not w._admitted(ask, wait=False):
                self._refused = time.monotonic()
                return
        else:
            w._engine_lock.release()  # the engine is idle: let evaluation and weight loads in while waiting
            w._engine_call_started = None
            try:
                with trace.span("wait for admission", group=self._next[0]):
                    admitted = w._admitted(ask)
            finally:
                while w._evaluating.is_set() and not w._stop.is_set():  # an evaluation waiting goes first
                    time.sleep(0.01)
                w._engine_lock.acquire()
                w._engine_call_started = time.monotonic()
            if not admitted:
                return
        self._ready.extend(self._next)
        self._next = []


class RefWorker:
    """One replica of the reference stage: the frozen reference model on this actor's device."""

    def __init__(self, spec: ActorSpec):
        quiet_start()
        self.scorer = make_ref_scorer(spec.enter())

    def ready(self) -> int:
        return os.getpid()

    def score(self, batch) -> torch.Tensor:
        """``ref_logprobs`` ``[n, Lr]`` of ``batch``'s answers."""
        with trace.span("reference", rows=batch.batch_size[0]):
            scored = self.scorer.score(batch)["ref_logprobs"]
        trace.flush()  # a replica may be killed without notice: each call's span is on disk
        return scored


class BufferActor(RolloutBuffer):
    """:class:`~grpo_rl.distributed.buffer.RolloutBuffer` as a threaded actor (blocking calls wait on its condition)."""

    def ready(self) -> int:
        return os.getpid()
