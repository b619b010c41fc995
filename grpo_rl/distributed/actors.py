"""The roles of the asynchronous loop as Ray actors: the collector (engine + environment) and the buffer.

The classes are plain Python; :mod:`grpo_rl.distributed.pipeline` wraps them with ``ray.remote`` and the
options of :func:`grpo_rl.distributed.ray_setup.actor_options`. Both are threaded actors: the collector's
:meth:`CollectorWorker.run` loop occupies one thread while ``set_weights``, ``stats`` and ``stop`` are
served by others; the buffer's blocking ``put``/``take`` wait on a condition variable, not on the actor.

A collector builds its engine and environment with the same ``make_*`` factories as the synchronous script;
the engine is :class:`grpo_rl.rollout.vllm_engine.VLLMEngine`, in-process inside the actor (its side effects on
the process, see that module, stay inside the actor).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch

from grpo_rl.buffer import RolloutBuffer

log = logging.getLogger(__name__)


def actor_run_context(cfg_container: dict, run_dir: str, model_path: str, device: torch.device):
    """A :class:`~grpo_rl.factories.RunContext` for one actor, whose only device is ``device``.

    The config was validated and the devices allocated by the driver; inside an actor Ray exposes just the
    actor's own GPU, so the allocation is not redone here (a reward model shares the actor's device).
    """
    from omegaconf import OmegaConf

    from grpo_rl.config import GRPOConfig
    from grpo_rl.devices import DeviceAllocation
    from grpo_rl.factories import RunContext, resolve_run_precision
    from grpo_rl.models import load_tokenizer

    cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), cfg_container)
    # A reward model runs inside the collector, on the collector's device: allocating it here again would look
    # for GPUs the actor cannot see.
    reward_model = (device,) if cfg.reward.model_path else ()
    devices = DeviceAllocation(train=(device,), ref=(device,), inference=(device,), reward_model=reward_model)
    return RunContext(cfg=cfg, run_dir=Path(run_dir), devices=devices, model_path=model_path,
                      tokenizer=load_tokenizer(model_path), precision=resolve_run_precision(cfg, devices))


class CollectorWorker:
    """Generates and scores batches with its engine as fast as the buffer accepts them.

    Args:
        cfg_container: the resolved run config, as a plain dict.
        run_dir: the run folder.
        model_path: the resolved model folder.
        device: the engine's device as seen inside the actor.
        buffer: the buffer actor handle (anything with ``put(batch, timeout) -> bool``).
        replica: this collector's index; with ``num_replicas`` collectors, collection ``k`` of replica ``r``
            is seeded as step ``k * num_replicas + r``, so replicas never repeat each other's samples.
        num_replicas: how many collectors feed the buffer.
        threads: torch threads for this process.
        poll_seconds: how often a blocked put wakes up to check for :meth:`stop`.
        weight_transfer_backend: ``"nccl"`` when weights arrive by NCCL broadcast (see :mod:`grpo_rl.weight_sync`).
    """

    def __init__(self, cfg_container: dict, run_dir: str, model_path: str, device: torch.device, buffer,
                 *, replica: int = 0, num_replicas: int = 1, threads: int = 1, poll_seconds: float = 1.0,
                 weight_transfer_backend: str | None = None):
        torch.set_num_threads(threads)
        from grpo_rl.factories import make_collector, make_engine
        from grpo_rl.quiet import quiet_start

        quiet_start()  # each actor is a process of its own: the same quiet start as the driver

        self.run_ctx = actor_run_context(cfg_container, run_dir, model_path, device)
        self.engine = make_engine(self.run_ctx, weight_transfer_backend=weight_transfer_backend)
        self.collector = make_collector(self.run_ctx, self.engine)
        self.buffer = buffer
        self.replica, self.num_replicas = replica, num_replicas
        self.poll_seconds = poll_seconds
        self.version = 0
        self._pending = None  # newest WeightPacket not yet loaded
        self._pending_lock = threading.Lock()  # held only for a moment: set_weights never waits for generation
        self._engine_lock = threading.Lock()  # vLLM is not thread-safe: one engine call at a time
        self._in_weight_update = False  # NCCL: the engine lock is held from start to finish of an update
        self._stop = threading.Event()
        self._stats = {"batches": 0, "samples": 0, "tokens": 0, "generation_seconds": 0.0, "reward_seconds": 0.0,
                       "reward_failures": 0, "busy_seconds": 0.0, "wait_for_space_seconds": 0.0, "weight_loads": 0,
                       "weight_load_seconds": 0.0}
        self._failure_examples: list[dict] = []  # failing reward calls since the driver last asked
        self._round: int | None = None  # rounds collected; set by a resumed data position
        self._skip_batches(replica)
        self._record_position()
        from grpo_rl.evaluation import make_evaluator

        self.evaluator = make_evaluator(self.run_ctx, self.engine) if replica == 0 else None

    def ready(self) -> bool:
        return True

    def set_weights(self, packet) -> None:
        """Queue new weights; they are loaded before the next generation call (the newest packet wins)."""
        with self._pending_lock:
            if self._pending is None or packet.version >= self._pending.version:
                self._pending = packet

    def set_version(self, version: int) -> None:
        """Stamp later samples with ``version`` (after a transport that loaded the weights itself, e.g. NCCL)."""
        with self._pending_lock:
            self.version = version

    def engine_rpc(self, method: str, *args) -> Any:
        """Forward a worker call to the engine between two generation calls (used by the NCCL transport).

        A weight update is several calls (``start_weight_update``, ``update_weights``..., ``finish_weight_update``);
        the engine stays locked from the first to the last, so no generation runs on half-loaded weights or on
        a prefix cache that still holds the old weights' keys and values.
        """
        if not self._in_weight_update:
            self._engine_lock.acquire()
        try:
            out = self.engine.llm.collective_rpc(method, args=args)
            if method == "finish_weight_update":
                self.engine.llm.reset_prefix_cache()
            self._in_weight_update = method == "start_weight_update" or (
                self._in_weight_update and method != "finish_weight_update")
        except BaseException:
            self._in_weight_update = False  # a failed update must not leave generation locked out
            raise
        finally:
            if not self._in_weight_update:
                self._engine_lock.release()
        return out

    def evaluate(self, step: int, last_step: int) -> dict[str, float]:
        """Held-out evaluation (``eval`` config group) with the newest weights pushed, between two generation
        calls; ``eval/policy_version`` says which."""
        if self.evaluator is None:
            return {}
        with self._engine_lock:
            self._load_pending_weights()
            return {**self.evaluator.maybe_evaluate(step, last_step), "eval/policy_version": self.version}

    def _skip_batches(self, count: int) -> None:
        """Advance the prompt stream past ``count`` batches: those the other replicas collect.

        Every replica walks the same seeded stream; replica ``r`` collects batches ``r, r + R, r + 2R, ...``,
        so the replicas share the prompts out and together see them in the synchronous loop's order.
        """
        for _ in range(count):
            self.collector.env.reset()

    def _load_pending_weights(self) -> None:
        from grpo_rl.weight_sync import unpack_weights

        with self._pending_lock:
            packet, self._pending = self._pending, None
        if packet is None:
            return
        t0 = time.perf_counter()
        self.engine.update_weights(unpack_weights(packet))
        self.version = packet.version
        self._stats["weight_loads"] += 1
        self._stats["weight_load_seconds"] += time.perf_counter() - t0

    def run(self, start_round: int = 0) -> dict:
        """Collect until :meth:`stop`, from round ``start_round`` (or the round of a resumed data position);
        each batch goes to the buffer (blocking while it is full). Round ``k`` is batch ``k * num_replicas +
        replica`` of the synchronous loop's stream, and seeds its sampling as that step."""
        import ray

        if self._round is None:
            self._round = start_round
        while not self._stop.is_set():
            t0 = time.perf_counter()
            with self._engine_lock:
                self._load_pending_weights()
                batch, cs = self.collector.collect(self._round * self.num_replicas + self.replica, self.version)
                self._skip_batches(self.num_replicas - 1)
                self._round += 1
                self._record_position()
                failures = getattr(self.collector.env, "last_failure_examples", None) or []
            with self._pending_lock:
                self._failure_examples.extend(failures)
            t1 = time.perf_counter()
            st = self._stats
            st["batches"] += 1
            st["samples"] += batch.batch_size[0]
            st["tokens"] += cs.num_tokens
            st["generation_seconds"] += cs.generation_seconds
            st["reward_seconds"] += cs.reward_seconds
            st["reward_failures"] += sum(cs.reward_failures.values())
            st["busy_seconds"] += t1 - t0
            while not self._stop.is_set():
                if ray.get(self.buffer.put.remote(batch, self.poll_seconds)):
                    break
                if ray.get(self.buffer.is_closed.remote()):  # shutting down: nobody will read again
                    self._stop.set()
            st["wait_for_space_seconds"] += time.perf_counter() - t1
        return self.stats()

    def stats(self) -> dict:
        return {**self._stats, "version": self.version, "replica": self.replica}

    def take_failure_examples(self) -> list[dict]:
        """The failing reward calls (component, error, answer) since the last call."""
        with self._pending_lock:
            out, self._failure_examples = self._failure_examples, []
        return out

    def env_state(self) -> dict:
        """The environment's data position after the last collected batch, with the number of rounds collected
        (``collector_round``, so a resumed run goes on with the same prompts and sampling seeds)."""
        return self._env_state

    def load_env_state(self, state: dict) -> None:
        """Continue from replica 0's saved position (the start of a round of ``num_replicas`` batches)."""
        with self._engine_lock:
            if "collector_round" in state:
                self._round = int(state["collector_round"])
            self.collector.env.load_state_dict(state)
            self._skip_batches(self.replica)
            self._record_position()

    def _record_position(self) -> None:
        """Note the data position (and the round, once known) that :meth:`env_state` reports; a checkpoint taken
        before this replica's next batch then still carries the round it resumed at."""
        round_ = {} if self._round is None else {"collector_round": self._round}
        self._env_state = {**self.collector.env.state_dict(), **round_}

    def stop(self) -> None:
        self._stop.set()

    def shutdown(self) -> None:
        self._stop.set()
        with self._engine_lock:
            self.engine.shutdown()


class BufferActor(RolloutBuffer):
    """:class:`~grpo_rl.buffer.RolloutBuffer` as a threaded actor (blocking calls wait on its condition)."""

    def ready(self) -> bool:
        return True
