"""The roles of a run, built from its placement: learner, reference, rollout source and weight sync.

Both entry scripts build their roles here, so that where a role runs (in the driver, or as Ray actors) is decided
once, by :mod:`grpo_rl.placement.context`, and never by a script:

* :func:`make_learner`: the learner in the driver, or a data-parallel / FSDP2 group of ranks;
* :func:`make_reference`: the reference scorer in the driver, or a stage of its own (:class:`ReferenceActors`);
* :func:`make_rollout_source`: the synchronous loop's in-process collector, or the asynchronous loop's actors;
* :func:`make_weight_sync`: in-place reload, Ray's object store, or a collective broadcast;
* :func:`make_roles`: all of them for one loop, with its :class:`PushPolicy`.

Ray is started once, by :func:`start_roles`, when some role runs as actors.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from dataclasses import dataclass

from grpo_rl.distributed.healing import Restarts
from grpo_rl.distributed.learner_group import LearnerGroup
from grpo_rl.distributed.pipeline import AsyncRollouts
from grpo_rl.distributed.reference_actors import ReferenceActors
from grpo_rl.engines.build import make_engine, start_servers
from grpo_rl.engines.server import ServerFleet
from grpo_rl.engines.vllm_plugin import KEY_ENV
from grpo_rl.errors import RoleFailed
from grpo_rl.placement.context import RunContext
from grpo_rl.placement.ray import start_ray, stop_ray
from grpo_rl.rollout.collector import make_collector
from grpo_rl.rollout.dynamic_sampling import DynamicSampling
from grpo_rl.rollout.evaluation import Evaluator, make_evaluator
from grpo_rl.rollout.source import InProcessRollouts, RolloutSource
from grpo_rl.training.build import make_local_learner, make_ref_scorer, seed_everything
from grpo_rl.training.protocols import LearnerProtocol, ReferenceScorer
from grpo_rl.weights.sync import InPlaceWeightSync, ObjectStoreWeightSync, WeightSync

log = logging.getLogger(__name__)


def start_roles(run: RunContext, cleanup: contextlib.ExitStack) -> None:
    """Start (or join) Ray if a role runs as actors, sized for them; it is stopped when ``cleanup`` closes."""
    placement = run.placement
    if placement.uses_ray:
        started = start_ray(
            run.cfg.ray, min_cpus=placement.ray_cpus, actor_gpus=placement.actor_gpus, withhold=(KEY_ENV,)
        )  # only collectors of served engines get it (collector_options)
        cleanup.callback(stop_ray, started)


def make_learner(run: RunContext):
    """The learner: in this process on one device, or ``train_model.num_devices`` ranks as actors."""
    if run.placement.learner.actors:
        return LearnerGroup(run)
    return make_local_learner(run)


def make_reference(run: RunContext, learner=None, restarts: Restarts | None = None, *, wait: bool = True):
    """The reference scorer (``score(batch)`` adds ``ref_logprobs``), or None without a KL penalty: in the driver
    (for LoRA, ``learner``'s model with its adapters off), or :class:`ReferenceActors` (``ref_model.placement``)
    replaced within ``restarts`` (``wait=False``: not waited for)."""
    placement = run.placement.reference
    if placement is not None and placement.actors:
        return ReferenceActors(run, timeout=run.cfg.pipeline.timeout_seconds, restarts=restarts, wait=wait)
    return make_ref_scorer(run, learner)


def make_rollout_source(
    run: RunContext,
    env,
    *,
    engine=None,
    reference=None,
    evaluator: Evaluator | None = None,
    fleet=None,
    restarts: Restarts | None = None,
) -> tuple[RolloutSource, ReferenceScorer | None]:
    """The rollout source (:class:`InProcessRollouts` over ``engine``, or without one :class:`AsyncRollouts`'
    collector actors; with DAPO's dynamic sampling when on), and the reference scorer the learner still applies
    (None when the source scores)."""
    return _collecting_source(
        run, env, engine=engine, reference=reference, evaluator=evaluator, fleet=fleet, restarts=restarts
    )


def _collecting_source(
    run: RunContext,
    env,
    *,
    engine,
    reference,
    evaluator,
    fleet=None,
    restarts=None,
    weight_sync=None,
    wait: bool = True,
):
    if engine is not None:
        heal = served_healer(fleet, engine, weight_sync, restarts) if fleet is not None else None
        collector = make_collector(run, engine, env)
        return InProcessRollouts(collector, evaluator, heal=heal, dynamic=dynamic_sampling(run)), reference
    stage = reference if isinstance(reference, ReferenceActors) else None
    rollouts = AsyncRollouts(
        run,
        env,
        reference=stage,
        fleet=fleet,
        restarts=restarts,
        wait=wait,
        weight_sync=functools.partial(make_weight_sync, run),
        dynamic=dynamic_sampling(run),
    )
    return rollouts, (None if stage is not None else reference)


def served_healer(fleet: ServerFleet, engine, weight_sync: WeightSync, restarts: Restarts):
    """The synchronous loop's healer for a failed collection with engine servers the run started: servers that no
    longer answer are restarted by ``fleet`` and given the newest weights, and the batch is collected again."""
    restarts.register("engine")

    def heal(error: RoleFailed) -> bool:
        lost = fleet.lost()
        if not lost:
            return False
        for index in lost:
            if not restarts.allowed("engine"):
                raise RoleFailed(f"{error}; {restarts.exhausted('engine')}") from error
            t0 = time.perf_counter()
            url = fleet.replace_lost(index)
            engine.replace_server(index, url)
            weight_sync.push_again()
            restarts.record("engine", index, str(error), time.perf_counter() - t0, url=url)
        return True

    return heal


def dynamic_sampling(run: RunContext) -> DynamicSampling | None:
    """DAPO's rule, when ``policy.dynamic_sampling`` is on: a step trains on ``env.prompts_per_step`` varied groups."""
    policy = run.cfg.policy
    if not policy.dynamic_sampling:
        return None
    return DynamicSampling(groups=run.cfg.env.prompts_per_step, max_extra_rounds=policy.dynamic_sampling_max_rounds)


def make_weight_sync(run: RunContext, collectors: list | None = None, *, engine=None) -> WeightSync:
    """In-place reload of ``engine`` (synchronous loop), or a push to the asynchronous loop's ``collectors``, by
    ``pipeline.weight_transport``."""
    if engine is not None:
        return InPlaceWeightSync(engine)
    transport = run.cfg.pipeline.weight_transport
    if transport == "auto":  # NCCL needs a GPU per rank: not between roles that share one
        transport = "collective" if run.devices.on_gpu and not run.devices.engine_shares_a_gpu else "object_store"
    if transport == "collective" and run.placement.learner.actors and run.devices.on_gpu:
        log.warning(
            "pipeline.weight_transport=collective broadcasts from the driver, which holds no GPU when the "
            "learner runs as ranks: using the object store"
        )
        transport = "object_store"
    if transport == "collective":
        from grpo_rl.weights.collective_sync import CollectiveWeightSync

        return CollectiveWeightSync(collectors, device=run.devices.train[0], timeout=run.cfg.pipeline.timeout_seconds)
    # a push skips a collector that died: its replacement is given the newest push
    return ObjectStoreWeightSync(
        collectors, timeout=run.cfg.pipeline.timeout_seconds, lost_ok=run.cfg.pipeline.max_restarts > 0
    )


@dataclass(frozen=True)
class PushPolicy:
    """When the loop pushes the learner's weights to the engines, and what a stop does to a step under way.

    Attributes:
        every: push once the learner is this many optimizer steps past the engines' weights (and before an
            evaluation); None: never, the engine generates with the learner's own model.
        stop_between_phases: a stop abandons the step at its next phase, before the update (the synchronous loop
            collects its batch again on resume); off, the step finishes (the asynchronous loop's batch was taken).
    """

    every: int | None = 1
    stop_between_phases: bool = True

    def due(self, version: int, pushed: int, evaluate: bool) -> bool:
        """Push now, with the learner at ``version`` and the engines at ``pushed``?"""
        if self.every is None or version == pushed:
            return False
        return version - pushed >= self.every or evaluate


@dataclass
class Roles:
    """What the loop runs a step with: where each one runs is decided here, from the run's placement."""

    source: RolloutSource
    learner: LearnerProtocol
    reference: ReferenceScorer | None
    """The reference the loop scores with; None without a KL penalty or when the source scores (a stage)."""
    weight_sync: WeightSync
    push: PushPolicy
    restarts: Restarts | None = None
    """The replacements of lost workers and restarts of the learner so far (``restarts/*`` metrics)."""


def make_roles(run: RunContext, env, eval_env, cleanup: contextlib.ExitStack) -> Roles:
    """The roles of ``run.mode``'s loop (``sync``: an engine in this process; ``async``: collector actors); each is
    shut down when ``cleanup`` closes."""
    cfg = run.cfg
    fleet = start_servers(run)  # the vLLM servers of a served engine, before anything that talks to them
    if fleet is not None:
        cleanup.callback(fleet.close)
    restarts = Restarts(cfg.pipeline.max_restarts, run.run_dir)
    if run.mode == "sync":
        shared = cfg.inference_model.share_weights
        engine = None if shared else make_engine(run, fleet=fleet)  # before the seeding (in-process vLLM seeds)
        seed_everything(cfg.seed)
        learner = make_learner(run)
        cleanup.callback(learner.shutdown)
        if shared:
            engine = make_engine(run, policy=learner.model, fleet=fleet)
        cleanup.callback(engine.shutdown)
        weight_sync = make_weight_sync(run, engine=engine)
        source, reference = _collecting_source(
            run,
            env,
            engine=engine,
            reference=make_reference(run, learner, restarts=restarts),
            evaluator=make_evaluator(run, engine, env=eval_env),
            fleet=fleet,
            restarts=restarts,
            weight_sync=weight_sync,
        )
        push = PushPolicy(every=None if shared else 1, stop_between_phases=True)
    else:
        # The actors (collectors, reference replicas) start while the driver loads the learner: one wait for all.
        # A reference in the driver is built after the learner (a LoRA learner's model is its reference).
        ref_actors = run.placement.reference is not None and run.placement.reference.actors
        rollouts, reference = _collecting_source(
            run,
            env,
            engine=None,
            reference=make_reference(run, restarts=restarts, wait=False) if ref_actors else None,
            evaluator=None,
            fleet=fleet,
            restarts=restarts,
            wait=False,
        )
        cleanup.callback(rollouts.close)
        source = rollouts
        seed_everything(cfg.seed)
        learner = make_learner(run)
        cleanup.callback(learner.shutdown)
        if not ref_actors:
            reference = make_reference(run, learner)
        rollouts.wait_started()  # and its reference stage, and the weight sync to its collectors
        weight_sync = rollouts.weight_sync
        push = PushPolicy(every=cfg.pipeline.push_every, stop_between_phases=False)
    cleanup.callback(weight_sync.close)
    if run.placement.learner.actors:
        restarts.register("learner")
    return Roles(
        source=source, learner=learner, reference=reference, weight_sync=weight_sync, push=push, restarts=restarts
    )
