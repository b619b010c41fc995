"""The roles of a run, built from its placement: learner, reference, rollout source and weight sync.

Both entry scripts build their roles here, so that where a role runs (in the driver, or as Ray actors) is decided
once, by :mod:`grpo_rl.run_context`, and never by a script:

* :func:`make_learner`: the learner in the driver, or a data-parallel / FSDP2 group of ranks;
* :func:`make_reference`: the reference scorer in the driver, or a stage of its own (:class:`ReferenceActors`);
* :func:`make_rollout_source`: the synchronous loop's in-process collector, or the asynchronous loop's actors;
* :func:`make_weight_sync`: in-place reload, Ray's object store, or a collective broadcast.

Ray is started once, by :func:`start_roles`, when some role runs as actors.
"""
from __future__ import annotations

import contextlib
import logging

from grpo_rl.distributed.learner_group import LearnerGroup
from grpo_rl.distributed.pipeline import AsyncRollouts
from grpo_rl.distributed.ray_setup import start_ray, stop_ray
from grpo_rl.distributed.reference_actors import ReferenceActors
from grpo_rl.dynamic_sampling import DynamicSampling
from grpo_rl.factories import make_collector, make_local_learner, make_ref_scorer
from grpo_rl.rollout_source import InProcessRollouts
from grpo_rl.run_context import RunContext
from grpo_rl.weight_sync import InPlaceWeightSync, ObjectStoreWeightSync

log = logging.getLogger(__name__)


def start_roles(run: RunContext, cleanup: contextlib.ExitStack) -> None:
    """Start (or join) Ray if a role runs as actors, sized for them; it is stopped when ``cleanup`` closes."""
    placement = run.placement
    if placement.uses_ray:
        started = start_ray(run.cfg.ray, min_cpus=placement.ray_cpus, actor_gpus=placement.actor_gpus)
        cleanup.callback(stop_ray, started)


def make_learner(run: RunContext):
    """The learner: in this process on one device, or ``train_model.num_devices`` ranks as actors."""
    if run.placement.learner.actors:
        return LearnerGroup(run)
    return make_local_learner(run)


def make_reference(run: RunContext, learner=None):
    """The reference scorer (``score(batch)`` adds ``ref_logprobs``), or None without a KL penalty: in the driver
    (for LoRA, ``learner``'s model with its adapters off), or :class:`ReferenceActors` when it is a stage of its
    own (``ref_model.placement``)."""
    placement = run.placement.reference
    if placement is not None and placement.actors:
        return ReferenceActors(run, timeout=run.cfg.pipeline.timeout_seconds)
    return make_ref_scorer(run, learner)


def make_rollout_source(run: RunContext, env, *, engine=None, reference=None):
    """The rollout source, and the reference scorer the learner still applies (None when the source scores).

    With ``engine``: the synchronous loop's :class:`InProcessRollouts` over ``engine`` and ``env``; the learner
    scores with ``reference`` wherever it runs. Without: the asynchronous loop's :class:`AsyncRollouts`, whose
    collector actors build their own engines and whose driver-side ``env`` tracks the stream position; a reference
    of its own actors becomes its stage between the buffer and the learner, so the three roles overlap.
    """
    if engine is not None:
        source = InProcessRollouts(make_collector(run, engine, env))
    else:
        stage = reference if isinstance(reference, ReferenceActors) else None
        source, reference = AsyncRollouts(run, env, reference=stage), (None if stage is not None else reference)
    policy = run.cfg.policy
    if policy.dynamic_sampling:  # DAPO: more batches until the step has env.prompts_per_step varied groups
        source = DynamicSampling(source, groups=run.cfg.env.prompts_per_step, pad_id=run.tokenizer.pad_token_id or 0,
                                 max_extra_rounds=policy.dynamic_sampling_max_rounds)
    return source, reference


def make_weight_sync(run: RunContext, *, engine=None, rollouts: AsyncRollouts | None = None):
    """In-place reload of ``engine`` (synchronous loop), or a push to ``rollouts``' collectors by
    ``pipeline.weight_transport`` (auto: a collective broadcast between GPUs, the object store on the CPU)."""
    if engine is not None:
        return InPlaceWeightSync(engine)
    transport = run.cfg.pipeline.weight_transport
    if transport == "auto":  # NCCL needs a GPU per rank: not between roles that share one
        transport = "collective" if run.devices.on_gpu and not run.devices.engine_shares_a_gpu else "object_store"
    if transport == "collective" and run.placement.learner.actors and run.devices.on_gpu:
        log.warning("pipeline.weight_transport=collective broadcasts from the driver, which holds no GPU when the "
                    "learner runs as ranks: using the object store")
        transport = "object_store"
    if transport == "collective":
        from grpo_rl.distributed.collective_sync import CollectiveWeightSync

        return CollectiveWeightSync(rollouts.collectors, device=run.devices.train[0],
                                    timeout=run.cfg.pipeline.timeout_seconds)
    return ObjectStoreWeightSync(rollouts.collectors, timeout=run.cfg.pipeline.timeout_seconds)
