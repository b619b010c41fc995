"""The driver's handle on the asynchronous rollout side: collector actors, the buffer actor, weight pushes.

:class:`AsyncRollouts` starts the actors (resources per role from the device allocation), hands the learner
batches that pass the staleness gate, pushes weights through a :class:`~grpo_rl.weight_sync.WeightSync`,
gathers the role metrics, notices a failed actor, and stops everything in :meth:`AsyncRollouts.shutdown`.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from omegaconf import OmegaConf

from grpo_rl.buffer import TakeResult
from grpo_rl.config import validate_async
from grpo_rl.distributed.ray_setup import actor_options, free_port, worker_device
from grpo_rl.weight_sync import NCCLWeightSync, ObjectStoreWeightSync, WeightSync

log = logging.getLogger(__name__)


class CollectorFailed(RuntimeError):
    """A collector actor stopped (its error, if any, is chained)."""


class AsyncRollouts:
    """Collector and buffer actors of one run.

    Args:
        run: the run context (config, devices, model folder).
        threads: torch threads per collector process.
    """

    def __init__(self, run, *, threads: int):
        import ray

        from grpo_rl.distributed.actors import BufferActor, CollectorWorker

        cfg, p = run.cfg, run.cfg.pipeline
        validate_async(cfg)
        # pipeline.weight_transport=auto: NCCL between GPUs, the object store otherwise
        self.transport = p.weight_transport
        if self.transport == "auto":
            self.transport = "nccl" if run.devices.on_gpu else "object_store"
        self.poll_seconds = p.poll_seconds
        self.push_every = p.push_every
        self.pushed_version = 0  # the learner version the engines hold: the initial weights until a push
        self.eval_every = cfg.eval.every
        self.buffer = ray.remote(BufferActor).options(num_cpus=0, max_concurrency=8).remote(
            p.buffer_capacity, p.max_staleness)
        container = OmegaConf.to_container(cfg, resolve=True)
        self.collectors = [
            ray.remote(CollectorWorker).options(**actor_options(dev, threads, max_concurrency=4)).remote(
                container, str(run.run_dir), run.model_path, worker_device(dev), self.buffer, replica=i,
                num_replicas=len(run.devices.inference), threads=threads, poll_seconds=p.poll_seconds,
                weight_transfer_backend="nccl" if self.transport == "nccl" else None)
            for i, dev in enumerate(run.devices.inference)
        ]
        self._runs: list = []
        self._closed = False
        try:
            ray.get([self.buffer.ready.remote()] + [c.ready.remote() for c in self.collectors])
        except BaseException:  # an actor failed to start (its error is above): do not leave the others running
            for actor in self.collectors + [self.buffer]:
                _quietly(ray.kill, actor)
            raise
        self.weight_sync: WeightSync | None = None
        self.env = _RemoteEnv(self)

    def connect_weights(self, learner) -> None:
        """Connect ``learner`` to the engines with the transport chosen at start-up."""
        if self.transport == "nccl":
            if not hasattr(learner, "model") or hasattr(learner, "weight_packet"):
                raise NotImplementedError("pipeline.weight_transport=nccl needs a single-process learner "
                                          "(train_model.num_devices=1); use weight_transport=object_store")
            import ray

            self.weight_sync = NCCLWeightSync(learner.model, self.collectors, master_address=ray.util.get_node_ip_address(),
                                              master_port=free_port())
        else:
            self.weight_sync = ObjectStoreWeightSync(self.collectors)

    def start(self, step: int) -> None:
        """Start collecting at round ``step`` (or, after a resume, at the round the saved data position records):
        replica ``r``'s batch of round ``k`` is the synchronous loop's batch ``k * num_replicas + r`` (same
        prompts, same sampling seed)."""
        self._runs = [c.run.remote(step) for c in self.collectors]

    def take(self, version: int, should_stop: Callable[[], bool] = lambda: False) -> TakeResult | None:
        """The next batch that passes the staleness gate at learner ``version``; blocks, raises if a collector
        died, and returns None if ``should_stop()`` turns true while waiting."""
        import ray

        waited, dropped = 0.0, 0
        while not should_stop():
            result: TakeResult = ray.get(self.buffer.take.remote(version, self.poll_seconds))
            waited += result.wait_seconds
            dropped += result.dropped
            if result.batch is not None:
                result.wait_seconds, result.dropped = waited, dropped
                return result
            self.check_health()
        return None

    def check_health(self) -> None:
        """Raise :class:`CollectorFailed` if a collector's loop has ended (with its error chained)."""
        import ray

        for replica, call in enumerate(self._runs):
            if not ray.wait([call], timeout=0)[0]:
                continue
            try:
                ray.get(call)
            except Exception as e:
                raise CollectorFailed(f"collector replica {replica} failed (its log is above): {e}") from e
            raise CollectorFailed(f"collector replica {replica} stopped without an error")

    def push(self, learner) -> float:
        """Send ``learner``'s weights to every engine; seconds the learner was blocked."""
        seconds = self.weight_sync.push(learner)
        self.pushed_version = learner.version
        return seconds

    def maybe_push(self, learner) -> float:
        """:meth:`push` once the learner is ``pipeline.push_every`` optimizer steps past the engines' version;
        seconds the learner was blocked (0 when nothing was sent)."""
        if learner.version - self.pushed_version >= self.push_every:
            return self.push(learner)
        return 0.0

    def maybe_evaluate(self, learner, step: int, last_step: int) -> dict[str, float]:
        """Held-out evaluation of ``learner``'s current weights by the first collector's engine, when
        ``eval.every`` says so (every ``every`` steps and after the last one); blocks until done.

        Weights the engines do not hold yet (``push_every > 1``) are pushed to every replica first, so that
        evaluation never leaves one replica generating training samples with weights the others lack.
        """
        import ray

        every = self.eval_every
        if not every or not (step % every == 0 or step == last_step):
            return {}
        if self.pushed_version != learner.version:
            self.push(learner)
        return ray.get(self.collectors[0].evaluate.remote(step, last_step))

    def stats(self) -> dict[str, float]:
        """Collector counters (summed over replicas) and buffer counters, since the start."""
        import ray

        per = ray.get([c.stats.remote() for c in self.collectors])
        out = {f"collector/{k}": float(sum(s[k] for s in per)) for k in per[0] if k not in ("version", "replica")}
        out["collector/version"] = float(min(s["version"] for s in per))
        out["collector/replicas"] = float(len(per))
        out.update({f"buffer/{k}": float(v) for k, v in ray.get(self.buffer.stats.remote()).items()})
        return out

    def engine_proxy(self, learner) -> "_EnginePush":
        """An object with the engine's ``update_weights`` that pushes ``learner``'s weights (for resume)."""
        return _EnginePush(self, learner)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the collectors, wake every blocked call, release the engines and kill the actors (once)."""
        import ray

        if self._closed:
            return
        self._closed = True
        for call in ([self.buffer.close.remote()] + [c.stop.remote() for c in self.collectors]):
            _quietly(ray.get, call, timeout=timeout)
        if self._runs:
            ray.wait(self._runs, num_returns=len(self._runs), timeout=timeout)
        _quietly(self.env.state_dict)
        self.env.frozen = True  # from here on the checkpoint gets the data position read just now
        for c in self.collectors:
            _quietly(ray.get, c.shutdown.remote(), timeout=timeout)
        if self.weight_sync is not None:
            _quietly(self.weight_sync.close)
        for actor in self.collectors + [self.buffer]:
            _quietly(ray.kill, actor)


class _RemoteEnv:
    """The collector's environment state, for checkpoints (``state_dict``/``load_state_dict`` like the env).

    In the asynchronous loop the collector runs ahead of the learner: the saved data position is the
    collector's, so the batches still in the buffer at a checkpoint are not seen again after resuming.
    """

    def __init__(self, rollouts: AsyncRollouts):
        self.rollouts = rollouts
        self._cache: dict | None = None
        self.frozen = False

    def state_dict(self) -> dict:
        """Replica 0's data position (see :meth:`~grpo_rl.distributed.actors.CollectorWorker.load_env_state`)."""
        import ray

        if self.frozen and self._cache is not None:
            return self._cache
        try:
            self._cache = ray.get(self.rollouts.collectors[0].env_state.remote(), timeout=30)
        except Exception as e:  # the actor is gone (Ctrl-C reached it, or it failed): keep the last known state
            if self._cache is None:
                raise
            log.warning("collector unreachable (%s); using its last known data position", type(e).__name__)
        return self._cache

    def load_state_dict(self, state: dict) -> None:
        import ray

        ray.get([c.load_env_state.remote(state) for c in self.rollouts.collectors])
        self._cache = state

    @property
    def last_failure_examples(self) -> list[dict]:
        """Failing reward calls of every replica since the last step (for ``reward_failures.jsonl``)."""
        import ray

        if self.frozen:
            return []
        return [e for c in self.rollouts.collectors for e in ray.get(c.take_failure_examples.remote())]


class _EnginePush:
    def __init__(self, rollouts: AsyncRollouts, learner):
        self.rollouts, self.learner = rollouts, learner

    def update_weights(self, named_weights) -> None:
        self.rollouts.push(self.learner)


def _quietly(fn, *args, **kwargs):
    """Call ``fn``; log instead of raising (shutdown must go on when an actor is already gone)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        log.debug("shutdown: %s(...) failed: %s", getattr(fn, "__name__", fn), e)
        return None


def step_rates(prev: dict[str, float], now: dict[str, float], seconds: float) -> dict[str, float]:
    """Per-step deltas and rates of the cumulative :meth:`AsyncRollouts.stats` counters."""
    d = {k: now[k] - prev.get(k, 0.0) for k in now}
    busy = max(d["collector/busy_seconds"], 1e-9)  # summed over replicas
    replicas = now["collector/replicas"]
    return {
        "collector_samples_per_second": d["collector/samples"] / max(seconds, 1e-9),
        "collector_tokens_per_second": d["collector/tokens"] / max(seconds, 1e-9),
        "collector_busy_fraction": min(1.0, d["collector/busy_seconds"] / replicas / max(seconds, 1e-9)),
        # The same names as the synchronous loop for the same quantities: seconds one engine spent generating and
        # scoring during this step (per replica), and its tokens per second while generating.
        "generation_tokens_per_second": d["collector/tokens"] / busy,
        "generation_seconds": d["collector/generation_seconds"] / replicas,
        "reward_seconds": d["collector/reward_seconds"] / replicas,
        "reward_failures": d["collector/reward_failures"],
        "collector_wait_seconds": d["collector/wait_for_space_seconds"],
        "weight_load_seconds": d["collector/weight_load_seconds"],
        "engine_version": now["collector/version"],
        "buffer_fill": now["buffer/fill"],
        "buffer_size": now["buffer/size"],
        "buffer_max_fill": now["buffer/max_fill"],
        "dropped_samples_total": now["buffer/dropped_samples"],
    }


def staleness_metrics(result: TakeResult) -> dict[str, float]:
    """Staleness of the samples about to be trained on (the bound is checked against ``staleness_max``)."""
    age = result.staleness.float()
    return {"staleness_mean": float(age.mean()) if age.numel() else 0.0,
            "staleness_max": int(age.max()) if age.numel() else 0,
            "dropped_samples": result.dropped, "learner_wait_seconds": result.wait_seconds}

