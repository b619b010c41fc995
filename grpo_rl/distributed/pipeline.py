"""The asynchronous loop's rollout source: collector actors -> buffer -> (reference stage) -> the learner.

:class:`AsyncRollouts` is a :class:`~grpo_rl.rollout.source.RolloutSource`. It starts one collector actor per
inference device and a buffer actor, hands the learner the next batch that passes the staleness gate with the
role metrics, and stops everything in :meth:`AsyncRollouts.close`. The collectors' counters and failing reward
calls travel with their batches through the buffer(s) (:meth:`~grpo_rl.distributed.buffer.RolloutBuffer.put`), so a step costs
the learner one call to the buffer however many collectors there are. With the reference as a stage of its own
(``ref_model.placement``), a thread of the driver moves batches from the collectors' buffer through the reference
actors into a second, one-batch buffer, so the reference scores batch ``k + 1`` while the learner trains on batch
``k``; the staleness gate applies where the learner takes, at the version it trains with.

Nothing hangs: a collector that dies, a reference replica that fails, or no batch within
``pipeline.timeout_seconds`` raises :class:`~grpo_rl.errors.RoleFailed` naming the role; the loop's cleanup then
checkpoints the last step boundary, whose stream position regenerates whatever was in flight
(:class:`~grpo_rl.rollout.source.StreamPosition`).
"""
from __future__ import annotations

import json
import logging
import threading
import time


from grpo_rl.distributed.buffer import TakeResult
from grpo_rl.distributed.actors import COLLECTOR_COUNTERS, BufferActor, CollectorWorker
from grpo_rl.distributed.reference_actors import ReferenceActors, wait_ready
from grpo_rl.errors import RoleFailed
from grpo_rl.rollout.source import Rollout, StreamPosition
from grpo_rl.placement.context import RunContext

log = logging.getLogger(__name__)


class AsyncRollouts:
    """Collector, buffer and (optionally) reference actors of one run.

    Args:
        run: the run context (Ray must be running).
        env: an environment of the run at the start of the stream (the driver's copy; it tracks the stream
            position, see :class:`~grpo_rl.rollout.source.StreamPosition`).
        reference: the reference stage, when the reference runs as actors (scored batches come out of this source
            with ``ref_logprobs``).
    """

    def __init__(self, run: RunContext, env, reference: ReferenceActors | None = None):
        import ray

        p = run.cfg.pipeline
        self.poll_seconds, self.timeout = p.poll_seconds, p.timeout_seconds
        self.position = StreamPosition(env)
        self.reference = reference
        self.versions_per_batch = run.cfg.train.updates_per_batch
        # With a reference stage the collectors fill an ungated buffer and the learner takes from a gated one.
        # Collectors start a batch only while it can still be trained within the bound (RolloutBuffer.admit).
        self.buffer = ray.remote(BufferActor).options(num_cpus=0, max_concurrency=8).remote(
            p.buffer_capacity, None if reference is not None else p.max_staleness, "buffer",
            admit_staleness=p.max_staleness, versions_per_batch=run.cfg.train.updates_per_batch)
        self.scored = self.buffer if reference is None else ray.remote(BufferActor).options(
            num_cpus=0, max_concurrency=8).remote(1, p.max_staleness, "scored")
        placement = run.placement.collector
        self.collectors = [
            ray.remote(CollectorWorker).options(**placement.ray_options(max_concurrency=4)).remote(
                run.actor_spec("collector", i), self.buffer, num_replicas=placement.count,
                poll_seconds=p.poll_seconds, timeout=p.timeout_seconds)
            for i in range(placement.count)
        ]
        self._buffers = [self.buffer] + ([self.scored] if reference is not None else [])
        pids = wait_ready(self.collectors + self._buffers, "collector", p.timeout_seconds)
        self.pids = {"collector": pids[: len(self.collectors)],
                     "reference": list(reference.pids) if reference is not None else []}
        (run.run_dir / "processes.json").write_text(json.dumps(self.pids))
        self._runs: list = []
        self._pump: threading.Thread | None = None
        self._pump_error: BaseException | None = None
        self._reference_seconds = 0.0  # the reference stage's busy time, summed (read by _step_metrics)
        self._reports: dict[str, dict] = {}  # the newest counters of each collector and buffer
        self._prev_stats: dict[str, float] | None = None
        self._step_started = time.perf_counter()
        self._closed = False

    # -- the RolloutSource protocol -------------------------------------------------------------------------------

    def next_batch(self, version: int, should_stop=lambda: False) -> Rollout | None:
        """The next batch that passes the staleness gate at learner ``version``. Blocks; raises
        :class:`~grpo_rl.errors.RoleFailed` when a role died or nothing came within ``pipeline.timeout_seconds``;
        returns None if ``should_stop()`` turns true while waiting."""
        if not self._runs:
            self._start()
        self.buffer.learner_progress.remote(version)  # the collectors' admission: the next take is at `version`
        waited, dropped, consumed = 0.0, 0, []
        t0 = time.perf_counter()
        while not should_stop():
            result: TakeResult = self._get(self.scored.take.remote(version, self.poll_seconds), "the buffer",
                                           extra=self.poll_seconds)
            waited += result.wait_seconds
            dropped += result.dropped
            consumed += result.consumed
            if result.consumed:  # a batch handed over is trained before the next take: that take is a step later
                ahead = self.versions_per_batch if result.batch is not None else 0
                self.buffer.learner_progress.remote(version + ahead, result.consumed)
            if result.batch is not None:
                result.wait_seconds, result.dropped = waited, dropped
                self.position.consume(consumed)
                self._reports.update(result.reports)
                return Rollout(batch=result.batch, metrics={**staleness_metrics(result), **self._step_metrics()},
                               failure_examples=result.failure_examples)
            self.check_health()
            if time.perf_counter() - t0 > self.timeout:
                raise RoleFailed(f"no batch from the {len(self.collectors)} collector(s) within "
                                 f"pipeline.timeout_seconds={self.timeout:g}; they are alive but produce nothing (a "
                                 "stuck engine?). Raise the timeout if one batch takes them that long")
        self.position.consume(consumed)
        return None

    def state_dict(self) -> dict:
        """The stream position: what was consumed, so a resumed run regenerates exactly the rest."""
        return self.position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self._runs:
            raise RuntimeError("load the stream position before the first next_batch")
        self.position.load_state_dict(state)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the collectors, wake every blocked call, release the engines and kill the actors (once)."""
        import ray

        if self._closed:
            return
        self._closed = True
        for call in ([b.close.remote() for b in self._buffers] + [c.stop.remote() for c in self.collectors]):
            _quietly(ray.get, call, timeout=timeout)
        if self._runs:
            ray.wait(self._runs, num_returns=len(self._runs), timeout=timeout)
        if self._pump is not None:
            self._pump.join(timeout)
        for c in self.collectors:
            _quietly(ray.get, c.shutdown.remote(), timeout=timeout)
        for actor in self.collectors + self._buffers:
            _quietly(ray.kill, actor)
        if self.reference is not None:
            self.reference.shutdown()

    # -- the rest ---------------------------------------------------------------------------------------------

    def _start(self) -> None:
        """Start collecting at the stream position (the start, or what a resumed checkpoint recorded)."""
        position = self.position.state_dict()
        self._runs = [c.run.remote(position) for c in self.collectors]
        self._prev_stats = self.stats()
        self._step_started = time.perf_counter()
        if self.reference is not None:
            self._pump = threading.Thread(target=self._pump_through_reference, name="reference-stage", daemon=True)
            self._pump.start()

    def _pump_through_reference(self) -> None:
        """Move batches from the collectors' buffer through the reference actors into the learner's buffer."""
        import ray

        try:
            while not self._closed:
                result: TakeResult = ray.get(self.buffer.take.remote(0, self.poll_seconds),
                                             timeout=self.poll_seconds + self.timeout)
                if result.batch is None:
                    if ray.get(self.buffer.is_closed.remote(), timeout=self.timeout):
                        return
                    continue
                t0 = time.perf_counter()
                batch = self.reference.score(result.batch)
                self._reference_seconds += time.perf_counter() - t0
                while not self._closed and not ray.get(
                        self.scored.put.remote(batch, self.poll_seconds, result.reports, result.failure_examples),
                        timeout=self.poll_seconds + self.timeout):
                    pass
        except BaseException as e:  # noqa: BLE001 - handed to the learner's thread by check_health
            if not self._closed:
                self._pump_error = e

    def check_health(self) -> None:
        """Raise :class:`~grpo_rl.errors.RoleFailed` if a collector's loop ended or the reference stage failed."""
        import ray

        if self._pump_error is not None:
            error = self._pump_error
            if isinstance(error, RoleFailed):
                raise error
            raise RoleFailed(f"the reference stage failed: {error}") from error
        for replica, call in enumerate(self._runs):
            if not ray.wait([call], timeout=0)[0]:
                continue
            try:
                ray.get(call)
            except Exception as e:
                raise RoleFailed(f"collector replica {replica} (pid {self.pids['collector'][replica]}) died: "
                                 f"{type(e).__name__}; its log is above") from e
            raise RoleFailed(f"collector replica {replica} stopped without an error")

    def evaluate(self, step: int, last_step: int) -> dict[str, float]:
        """Held-out evaluation by the first collector's engine with the newest weights pushed to it."""
        return self._get(self.collectors[0].evaluate.remote(step, last_step), "collector replica 0 (evaluation)")

    def stats(self) -> dict[str, float]:
        """Collector counters (summed over replicas) and the collectors' buffer's counters since the start, as of
        the newest batch each collector put."""
        return combine_reports(self._reports, len(self.collectors))

    def _step_metrics(self) -> dict[str, float]:
        now, t = self.stats(), time.perf_counter()
        metrics = step_rates(self._prev_stats or {}, now, t - self._step_started)
        if self.reference is not None:
            metrics["reference_seconds"] = self._reference_seconds - self._prev_stats.get("reference/busy_seconds", 0.0)
            now["reference/busy_seconds"] = self._reference_seconds
        self._prev_stats, self._step_started = now, t
        return metrics

    def _get(self, calls, role: str, extra: float = 0.0):
        """``ray.get`` within ``pipeline.timeout_seconds``; a dead or silent actor raises
        :class:`~grpo_rl.errors.RoleFailed` naming ``role`` (a collector that died is named by its replica)."""
        import ray

        try:
            return ray.get(calls, timeout=self.timeout + extra)
        except ray.exceptions.GetTimeoutError as e:
            raise RoleFailed(f"{role} did not answer within pipeline.timeout_seconds={self.timeout:g}") from e
        except ray.exceptions.RayError as e:
            self.check_health()  # names the collector replica that died, if one did
            raise RoleFailed(f"{role} failed: {e}") from e


def _quietly(fn, *args, **kwargs):
    """Call ``fn``; log instead of raising (shutdown must go on when an actor is already gone)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        log.debug("shutdown: %s(...) failed: %s", getattr(fn, "__name__", fn), e)
        return None


def combine_reports(reports: dict[str, dict], num_collectors: int) -> dict[str, float]:
    """The collectors' counters summed (a collector that has not reported yet counts zero; ``collector/version`` is
    the oldest reported engine's) and the buffers', from the reports that came with the batches."""
    per = [r for name, r in reports.items() if name.startswith("collector/")]
    out = {f"collector/{k}": float(sum(r.get(k, 0) for r in per)) for k in COLLECTOR_COUNTERS}
    out["collector/version"] = float(min((r["version"] for r in per), default=0))
    out["collector/replicas"] = float(num_collectors)
    buffer = reports.get("buffer", {})
    out.update({f"buffer/{k}": float(buffer.get(k, 0)) for k in ("fill", "size", "max_fill")})
    # The gate drops in the buffer the learner takes from: the collectors' one, or the reference stage's.
    out["buffer/dropped_samples"] = float(sum(reports.get(name, {}).get("dropped_samples", 0)
                                              for name in ("buffer", "scored")))
    return out


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
    out = {"staleness_mean": float(age.mean()) if age.numel() else 0.0,
           "staleness_max": int(age.max()) if age.numel() else 0,
           "dropped_samples": result.dropped, "learner_wait_seconds": result.wait_seconds}
    batch = result.batch
    if batch is not None and "behavior_version" in batch.keys() and age.numel():
        # each token's own age (a group's age is its oldest token's): lower where pushes landed in flight
        mask = batch["response_mask"].bool()
        now = (result.staleness + batch["policy_version"])[:, None]  # [N, 1] the learner's version at the take
        token_age = (now - batch["behavior_version"]).float()[mask]
        out["token_staleness_mean"] = float(token_age.mean()) if token_age.numel() else 0.0
    return out
