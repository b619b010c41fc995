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
from collections.abc import Iterator

from grpo_rl.quiet import quiet_logging, quiet_start

# An actor's process imports this module first: drop the known notices of the imports below before they print.
quiet_logging()

import torch

from grpo_rl import trace
from grpo_rl.distributed.buffer import RolloutBuffer
from grpo_rl.engines.build import make_engine
from grpo_rl.placement.context import ActorSpec
from grpo_rl.rollout.collector import make_collector
from grpo_rl.rollout.evaluation import make_evaluator
from grpo_rl.training.build import make_ref_scorer
from grpo_rl.weights.sync import unpack_weights

# A collector's cumulative counters; each batch it puts carries them to the driver (see RolloutBuffer.put).
COLLECTOR_COUNTERS = (
    "batches",
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
    """Generates and scores batches with its engine as fast as the buffer accepts them: replica ``r`` of
    ``num_replicas`` collects the stream's batches ``b`` with ``b % num_replicas == r`` not consumed yet.

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
        with self._engine_lock:
            self._load_pending_weights()
            return {**self.evaluator.maybe_evaluate(step, last_step), "eval/policy_version": self.version}

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
        state dict; None: the start), putting each batch in the buffer."""
        import ray

        env = self.collector.env
        if position is not None:
            env.load_state_dict(position)
        for index, own in replica_indices(position, self.replica, self.num_replicas):
            if self._stop.is_set():
                break
            if not own:
                env.reset()  # another replica's batch, or one consumed before the resume: skip its prompts
                continue
            t0 = time.perf_counter()
            with trace.span("wait for admission", batch=index):
                admitted = self._admitted(index)
            if not admitted:
                break
            if self._push_error is not None:  # its server holds weights of no known version
                raise self._push_error
            t_admitted = time.perf_counter()
            with self._engine_lock:
                self._load_pending_weights()
                self._engine_call_started = time.monotonic()
                try:  # seeded as step index: a resumed run regenerates exactly what was not consumed
                    batch, cs = self.collector.collect(index, self.version)
                finally:
                    self._engine_call_started = None
            batch.set("batch_index", torch.full((batch.batch_size[0],), index, dtype=torch.long))
            t1 = time.perf_counter()
            st = self._stats
            st["batches"] += 1
            st["samples"] += batch.batch_size[0]
            st["tokens"] += cs.num_tokens
            st["generation_seconds"] += cs.generation_seconds
            st["reward_seconds"] += cs.reward_seconds
            st["reward_failures"] += sum(cs.reward_failures.values())
            st["busy_seconds"] += t1 - t_admitted
            st["wait_for_space_seconds"] += t_admitted - t0
            # The counters and failing reward calls travel with the batch: no per-step call from the driver.
            report = {f"collector/{self.replica}": self.stats()}
            w_put = trace.now_us()
            while not self._stop.is_set():
                if ray.get(
                    self.buffer.put.remote(batch, self.poll_seconds, report, cs.failure_examples), timeout=self.timeout
                ):
                    break
                if ray.get(self.buffer.is_closed.remote(), timeout=self.timeout):  # shutting down: nobody reads
                    self._stop.set()
            st["wait_for_space_seconds"] += time.perf_counter() - t1
            trace.record("wait for space", w_put, trace.now_us(), batch=index)
        trace.flush()
        return self.stats()

    def _admitted(self, index: int) -> bool:
        """Wait until the buffer admits a batch generated with the newest weights (they are loaded while waiting,
        so a push that lands meanwhile counts); False when stopping."""
        import ray

        while not self._stop.is_set():
            # An in-flight push that failed leaves the version where it was, so admission may never come: raised here,
            # the collector is replaced at once instead of waiting for weights that cannot land.
            if self._push_error is not None:
                raise self._push_error
            with self._engine_lock:
                self._load_pending_weights()
            if ray.get(self.buffer.admit.remote(index, self.version, self.poll_seconds), timeout=self.timeout):
                return True
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
        self.version = -1

    def shutdown(self) -> None:
        self._stop.set()
        trace.flush()
        with self._engine_lock:
            self.engine.shutdown()
        if self._receiver is not None:
            self._receiver.close()


def replica_indices(position: dict | None, replica: int, num_replicas: int) -> Iterator[tuple[int, bool]]:
    """The stream's batch indices from ``position`` on, each with whether replica ``replica`` of ``num_replicas``
    collects it."""
    index = int(position.get("next_index", 0)) if position else 0
    consumed = set(position.get("consumed", ())) if position else set()
    while True:
        # its own share of the synchronous loop's stream, minus what was consumed before a resume
        yield index, index % num_replicas == replica and index not in consumed
        index += 1


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
