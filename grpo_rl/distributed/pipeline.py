"""The asynchronous loop's rollout source: collector actors -> buffer -> (reference stage) -> the learner.

:class:`AsyncRollouts` is a :class:`~grpo_rl.rollout.source.RolloutSource`. It starts one collector actor per
inference device and a buffer actor, hands the learner its next batch with the role metrics, and stops everything in
:meth:`AsyncRollouts.close`. The unit is the group: each collector keeps up to ``env.prompts_per_step`` prompts in
flight on its engine, each started once the buffer admits it, and puts each group in the buffer the moment it is
scored; the learner's batch is the next ``env.prompts_per_step`` groups that pass the staleness gate, in the order they
arrived, from whichever collectors made them. So the longest answer of a batch holds back no other group (with
``pipeline.whole_batches`` a collector hands over ``P`` groups at a time, as this pipeline did before).

The collectors' counters and failing reward calls travel with their groups through the buffer(s)
(:meth:`~grpo_rl.distributed.buffer.RolloutBuffer.put`), so a step costs the learner one call to the buffer however
many collectors there are. With the reference as a stage of its own (``ref_model.placement``), a thread of the driver
moves batches of ``P`` groups from the collectors' buffer through the reference actors into a second, one-batch
buffer, so the reference scores batch ``k + 1`` while the learner trains on batch ``k``; the staleness gate applies
where the learner takes, at the version it trains with.

Nothing hangs, and losses heal. A collector whose loop ended with an error (its actor died, its engine or engine
server failed), or that has been inside one engine call for longer than ``pipeline.timeout_seconds`` when no batch
came for that long, is replaced (:meth:`AsyncRollouts.replace_collector`): the old actor is killed, its engine
server started again if the run owns it and it is gone, and a new actor on the same devices is given the newest
weights and the stream position of the groups it owes: those of its share that the learner has not consumed and
the buffer never received. The buffer keeps the first copy of any group index and drops a second one, so a put
from a lost actor that lands late cannot be trained twice. Past ``pipeline.max_restarts`` replacements
(:class:`~grpo_rl.distributed.healing.Restarts`), or when the buffer itself is lost, :class:`~grpo_rl.errors.RoleFailed`
names the role; the loop's cleanup then checkpoints the last step boundary, whose stream position regenerates
whatever was in flight (:class:`~grpo_rl.rollout.source.StreamPosition`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from grpo_rl.distributed.actors import COLLECTOR_COUNTERS, BufferActor, CollectorWorker
from grpo_rl.distributed.buffer import TakeResult
from grpo_rl.distributed.healing import Restarts, died_how, record_pids
from grpo_rl.distributed.reference_actors import ReferenceActors, wait_ready
from grpo_rl.engines.vllm_plugin import KEY_ENV
from grpo_rl.errors import RoleFailed
from grpo_rl.placement.context import RunContext
from grpo_rl.rollout.dynamic_sampling import DynamicSampling
from grpo_rl.rollout.source import Rollout, StreamPosition
from grpo_rl.weights.sync import WeightSync

log = logging.getLogger(__name__)


class AsyncRollouts:
    """Collector, buffer and (optionally) reference actors of one run; Ray must be running.

    Args:
        env: an environment of the run at the start of the stream (the driver's copy; it tracks the stream
            position, see :class:`~grpo_rl.rollout.source.StreamPosition`).
        reference: the reference stage, when the reference runs as actors (scored batches come out of this source
            with ``ref_logprobs``).
        fleet: the engine servers the run started (:class:`~grpo_rl.engines.server.ServerFleet`), one per
            collector; a lost one is started again with its collector.
        restarts: the run's replacement budget and record (default: one of ``pipeline.max_restarts``).
        weight_sync: builds the run's weight sync over the collector actors once they have started
            (:func:`~grpo_rl.run.roles.make_weight_sync`); kept as :attr:`weight_sync`, it gives a replacement
            collector the newest push.
    """

    def __init__(
        self,
        run: RunContext,
        env,
        reference: ReferenceActors | None = None,
        fleet=None,
        restarts: Restarts | None = None,
        *,
        weight_sync: Callable[[list], WeightSync],
        wait: bool = True,
        dynamic: DynamicSampling | None = None,
    ):
        import ray

        p = run.cfg.pipeline
        self.run, self.fleet = run, fleet
        self._make_weight_sync = weight_sync
        self.weight_sync: WeightSync | None = None
        """The run's weight sync, built by :meth:`wait_started`."""
        self.restarts = restarts if restarts is not None else Restarts(p.max_restarts, run.run_dir)
        self.restarts.register("collector")
        self.poll_seconds, self.timeout, self.start_timeout = p.poll_seconds, p.timeout_seconds, p.start_timeout_seconds
        self.position = StreamPosition(env)
        self.reference = reference
        self.versions_per_batch = run.cfg.train.updates_per_batch
        self.per_batch, self.dynamic = run.cfg.env.prompts_per_step, dynamic
        self.max_draws = dynamic.max_draws if dynamic is not None else None
        self.pad_id = run.tokenizer.pad_token_id or 0
        # With a reference stage the collectors fill an ungated buffer and the learner takes from a gated one.
        # Collectors start a batch only while it can still be trained within the bound (RolloutBuffer.admit).
        # The buffers live on the driver's node: what they hold cannot be rebuilt elsewhere, and a node that is
        # lost takes only workers that can be replaced.
        here = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(  # hard: soft ones were seen to spill
            ray.get_runtime_context().get_node_id(), soft=False
        )
        buffer = ray.remote(BufferActor).options(num_cpus=0, max_concurrency=8, scheduling_strategy=here)
        self.buffer = buffer.remote(
            p.buffer_capacity * (1 if p.whole_batches else self.per_batch),  # as many groups, whatever an entry holds
            None if reference is not None else p.max_staleness,
            "buffer",
            admit_staleness=p.max_staleness,
            versions_per_batch=run.cfg.train.updates_per_batch,
            groups_per_batch=self.per_batch,
            drop_flat=dynamic is not None,
            pad_id=self.pad_id,
        )
        # the reference stage's buffer holds scored batches, one entry each
        self.scored = (
            self.buffer if reference is None else buffer.remote(1, p.max_staleness, "scored", pad_id=self.pad_id)
        )
        self._take_groups = self.per_batch if reference is None else 1
        self.num_replicas = run.placement.collector.count
        self.collectors = [self._new_collector(i) for i in range(self.num_replicas)]
        self._buffers = [self.buffer] + ([self.scored] if reference is not None else [])
        self.pids: dict[str, list[int]] = {}
        self._runs: list = []
        self._pump: threading.Thread | None = None
        self._pump_error: BaseException | None = None
        self._pump_stop = threading.Event()
        self._reference_seconds = 0.0  # the reference stage's busy time, summed (read by _step_metrics)
        self._reports: dict[str, dict] = {}  # the newest counters of each collector and buffer
        self._prev_stats: dict[str, float] | None = None
        self._step_started = time.perf_counter()
        self._closed = False
        self.nodes: list = []
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Wait (once) until the collectors, the buffers and the reference stage have started. Raises
        :class:`RoleFailed` naming the role if one fails or takes past ``pipeline.start_timeout_seconds``."""
        if self.pids:
            return
        pids = wait_ready(self.collectors + self._buffers, "collector", self.start_timeout)
        if self.reference is not None:
            self.reference.wait_started()
        self.pids = {"collector": pids[: len(self.collectors)]}
        self.nodes = self._get([c.node.remote() for c in self.collectors], "the collectors", heal=False)
        self._write_pids()
        self.weight_sync = self._make_weight_sync(self.collectors)

    # -- the RolloutSource protocol -------------------------------------------------------------------------------

    def next_batch(self, version: int, should_stop=lambda: False) -> Rollout | None:
        """The next batch that passes the staleness gate at learner ``version``. Blocks; raises
        :class:`~grpo_rl.errors.RoleFailed` when a role died or nothing came within ``pipeline.timeout_seconds``;
        returns None if ``should_stop()`` turns true while waiting."""
        if not self._runs:
            self._start()
        self.check_health()  # a lost collector is replaced at once, not when the others can no longer cover for it
        self.buffer.learner_progress.remote(version)  # the collectors' admission: the next take is at `version`
        waited, dropped, consumed = 0.0, 0, []
        t0 = time.perf_counter()
        while not should_stop():
            take = self.scored.take.remote(version, self.poll_seconds, self._take_groups, self.max_draws)
            result: TakeResult = self._get(take, "the buffer", extra=self.poll_seconds)
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
                metrics = {**staleness_metrics(result), **self._step_metrics()}
                if self.dynamic is not None:
                    metrics.update(self.dynamic.metrics(result.batch, result.flat, self.pad_id))
                return Rollout(batch=result.batch, metrics=metrics, failure_examples=result.failure_examples)
            self.check_health()
            if time.perf_counter() - t0 > self.timeout:
                hung = self._hung_collectors()
                if not hung:
                    raise RoleFailed(
                        f"no batch from the {len(self.collectors)} collector(s) within "
                        f"pipeline.timeout_seconds={self.timeout:g}; they are alive but produce nothing "
                        "(a stuck engine?). Raise the timeout if one batch takes them that long"
                    )
                for replica in hung:
                    self.replace_collector(replica, f"no answer within pipeline.timeout_seconds={self.timeout:g}")
                t0 = time.perf_counter()
        self.position.consume(consumed)
        return None

    def state_dict(self) -> dict:
        """The stream position: what was consumed, so a resumed run regenerates exactly the rest."""
        return self.position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self._runs:
            raise RuntimeError("load the stream position before the first next_batch, or after rewind()")
        self.position.load_state_dict(state)

    def rewind(self) -> None:
        """Stop the collectors' loops and the reference stage and empty the buffers; the next :meth:`next_batch`
        starts them again at the position :meth:`load_state_dict` gives (a lost learner's restart)."""
        import ray

        if not self._runs:
            return
        self._pump_stop.set()
        for c in self.collectors:
            _quietly(ray.get, c.stop.remote(), timeout=self.timeout)
        ray.wait(self._runs, num_returns=len(self._runs), timeout=self.timeout)
        if self._pump is not None:
            self._pump.join(self.timeout)
        self._get([b.reset.remote() for b in self._buffers], "the buffer", heal=False)
        for c in self.collectors:  # one that died is replaced when its loop is started again
            _quietly(ray.get, c.rearm.remote(), timeout=self.timeout)
        self._runs, self._pump, self._pump_error = [], None, None
        self._pump_stop.clear()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the collectors, wake every blocked call, release the engines and kill the actors (once)."""
        import ray

        if self._closed:
            return
        self._closed = True
        for call in [b.close.remote() for b in self._buffers] + [c.stop.remote() for c in self.collectors]:
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
        self.wait_started()
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
            while not self._closed and not self._pump_stop.is_set():
                take = self.buffer.take.remote(0, self.poll_seconds, self.per_batch, self.max_draws)
                result: TakeResult = ray.get(take, timeout=self.poll_seconds + self.timeout)
                if result.batch is None:
                    if ray.get(self.buffer.is_closed.remote(), timeout=self.timeout):
                        return
                    continue
                t0 = time.perf_counter()
                batch = self.reference.score(result.batch)
                self._reference_seconds += time.perf_counter() - t0
                while (
                    not self._closed
                    and not self._pump_stop.is_set()
                    and not ray.get(
                        self.scored.put.remote(
                            batch, self.poll_seconds, result.reports, result.failure_examples, result.flat
                        ),
                        timeout=self.poll_seconds + self.timeout,
                    )
                ):
                    pass
        except BaseException as e:  # noqa: BLE001 - handed to the learner's thread by check_health
            if not self._closed:
                self._pump_error = e

    def check_health(self) -> None:
        """Replace every collector whose loop ended with an error (see the module docstring); raise
        :class:`~grpo_rl.errors.RoleFailed` when the reference stage failed, a collector's loop ended without one,
        or a replacement is not allowed or fails."""
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
            except Exception as e:  # noqa: BLE001 - the actor died or its loop raised: replaced, or the run ends
                self.replace_collector(replica, _cause(e), error=e)
                continue
            raise RoleFailed(f"collector replica {replica} stopped without an error")

    def replace_collector(self, replica: int, cause: str, error: BaseException | None = None) -> None:
        """Kill collector ``replica``, start another on its devices (and its engine server again, when the run
        owns it and it no longer answers), give it the newest weights, and start it on the batches it owes.

        Raises:
            RoleFailed: naming the replica, its process and node, and ``cause``, when ``pipeline.max_restarts``
                replacements were used up or the replacement could not start.
        """
        who = f"collector replica {replica} (pid {self.pids['collector'][replica]}, node {self.nodes[replica][:12]})"
        if not self.restarts.allowed("collector"):
            raise RoleFailed(f"{who} {cause}; {self.restarts.exhausted('collector')}; its log is above") from error
        if not self.weight_sync.can_replace:
            raise RoleFailed(
                f"{who} {cause}; pipeline.weight_transport=collective cannot give a replacement its "
                "weights (its broadcast group is fixed at start): use pipeline.weight_transport="
                "object_store to have lost collectors replaced"
            ) from error
        log.warning("%s %s: replacing it", who, cause)
        t0 = time.perf_counter()
        _kill_and_wait(self.collectors[replica], self.timeout)
        self._heal_engine_server(replica)
        actor = self._new_collector(replica)
        try:
            pid = wait_ready([actor], "replacement collector", self.start_timeout)[0]
            self.nodes[replica] = self._get(actor.node.remote(), "the replacement collector", heal=False)
        except RoleFailed as e:
            raise RoleFailed(f"{who} {cause}, and its replacement failed: {e}") from error
        self.collectors[replica] = actor
        self.weight_sync.send_newest(replica, actor)  # the newest push, before it generates anything
        position = self.owed_position()
        self._runs[replica] = actor.run.remote(position)
        self.pids["collector"][replica] = pid
        self._write_pids()
        self.restarts.record(
            "collector",
            replica,
            cause,
            time.perf_counter() - t0,
            pid=pid,
            node=self.nodes[replica],
            resumes_at=position["next_group"],
        )

    def owed_position(self) -> dict:
        """The stream position a replacement starts from: the learner's watermark, with every group the buffer
        received since counted as done (a replica regenerates its own share of the rest)."""
        position = self.position.state_dict()
        delivered = self._get(self.buffer.delivered.remote(position["next_group"]), "the buffer", heal=False)
        position["consumed_groups"] = sorted(set(position["consumed_groups"]) | set(delivered))
        return position

    def _new_collector(self, replica: int):
        import ray

        # Each collector drives one of the run's servers (the fleet's address now, a replaced server's new one).
        urls = self.fleet.urls if self.fleet is not None else None
        spec = self.run.actor_spec("collector", replica, engine_urls=urls)
        p = self.run.cfg.pipeline
        return (
            ray.remote(CollectorWorker)
            .options(**collector_options(self.run))
            .remote(
                spec,
                self.buffer,
                num_replicas=self.num_replicas,
                poll_seconds=p.poll_seconds,
                timeout=p.timeout_seconds,
            )
        )

    def _heal_engine_server(self, replica: int) -> None:
        """Start collector ``replica``'s engine server again when the run owns it and it does not answer (the
        user's servers, ``inference_model.urls``, are theirs to restart)."""
        if self.fleet is None:
            return
        index = replica % len(self.fleet.servers)
        if not self.fleet.healthy(index):
            self.fleet.replace_lost(index)

    def _hung_collectors(self) -> list[int]:
        """The replicas inside one engine call for longer than ``pipeline.timeout_seconds``, or that do not answer
        at all."""
        import ray

        calls = [c.engine_call_seconds.remote() for c in self.collectors]
        ready, _ = ray.wait(calls, num_returns=len(calls), timeout=min(self.timeout, 10 * self.poll_seconds))
        hung = []
        for replica, call in enumerate(calls):
            try:
                if call not in ready or ray.get(call) > self.timeout:
                    hung.append(replica)
            except ray.exceptions.RayError:
                hung.append(replica)
        return hung

    def _write_pids(self) -> None:
        record_pids(self.run.run_dir, "collector", self.pids["collector"])
        if self.reference is not None:
            record_pids(self.run.run_dir, "reference", self.reference.pids)

    def evaluate(self, step: int, last_step: int) -> dict[str, float]:
        """Held-out evaluation by the first collector's engine with the newest weights pushed to it (by its
        replacement, if it is lost meanwhile)."""
        import ray

        try:
            return self._get(self.collectors[0].evaluate.remote(step, last_step), "collector replica 0 (evaluation)")
        except RoleFailed as e:
            if not isinstance(e.__cause__, ray.exceptions.RayActorError):
                raise
        # it died: _get had it replaced (or the run ends there); the replacement holds the newest weights
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

    def _get(self, calls, role: str, extra: float = 0.0, heal: bool = True):
        """``ray.get`` within ``pipeline.timeout_seconds``; a dead or silent actor raises
        :class:`~grpo_rl.errors.RoleFailed` naming ``role``. With ``heal``, collectors that died are replaced first
        (off inside a replacement: one loss is not healed twice)."""
        import ray

        try:
            return ray.get(calls, timeout=self.timeout + extra)
        except ray.exceptions.GetTimeoutError as e:
            raise RoleFailed(f"{role} did not answer within pipeline.timeout_seconds={self.timeout:g}") from e
        except ray.exceptions.RayError as e:
            if heal:
                self.check_health()
            raise RoleFailed(f"{role} failed: {e}") from e


def _cause(error: BaseException) -> str:
    """What happened to a collector, in a few words: its actor died (and how), or its loop raised."""
    import ray

    if isinstance(error, ray.exceptions.RayActorError):
        return f"died ({died_how(error)})"
    first = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    return f"failed: {first[:300]}"


def _kill_and_wait(actor, timeout: float) -> None:
    """Kill ``actor`` and wait until it is gone: a batch it was about to put can then no longer arrive."""
    import ray

    _quietly(ray.kill, actor, no_restart=True)
    deadline = time.monotonic() + min(timeout, 30.0)
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ready.remote(), timeout=1.0)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            continue
        time.sleep(0.1)


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
    out["buffer/dropped_samples"] = float(
        sum(reports.get(name, {}).get("dropped_samples", 0) for name in ("buffer", "scored"))
    )
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


def collector_options(run: RunContext) -> dict:
    """Ray options of a collector actor; where its engine is a server, it alone of the run's actors gets the engine
    key."""
    # only here: a runtime_env is stored in Ray's GCS, and learners and reference replicas never talk to a server
    key = os.environ.get(KEY_ENV) if run.placement.served else None
    # SPREAD: across the nodes of a cluster, so that a lost node takes as few collectors as it can
    return run.placement.collector.ray_options(
        max_concurrency=4, scheduling_strategy="SPREAD", env={KEY_ENV: key} if key else None
    )


def staleness_metrics(result: TakeResult) -> dict[str, float]:
    """Staleness of the samples about to be trained on (the bound is checked against ``staleness_max``)."""
    age = result.staleness.float()
    out = {
        "staleness_mean": float(age.mean()) if age.numel() else 0.0,
        "staleness_max": int(age.max()) if age.numel() else 0,
        "dropped_samples": result.dropped,
        "learner_wait_seconds": result.wait_seconds,
    }
    batch = result.batch
    if batch is not None and "behavior_version" in batch.keys() and age.numel():
        # each token's own age (a group's age is its oldest token's): lower where pushes landed in flight
        mask = batch["response_mask"].bool()
        now = (result.staleness + batch["policy_version"])[:, None]  # [N, 1] the learner's version at the take
        token_age = (now - batch["behavior_version"]).float()[mask]
        out["token_staleness_mean"] = float(token_age.mean()) if token_age.numel() else 0.0
    return out
