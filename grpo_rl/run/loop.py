"""The one training loop, run by both entry scripts and by the Python API.

GRPO (Shao et al., 2024, "DeepSeekMath", Algorithm 1) as an actor/learner loop: each step takes a batch of
``G`` answers per prompt, scored and stamped with the policy version that sampled them, from the rollout source;
scores it with the reference and turns rewards into group-relative advantages; takes the learner's update; pushes
the new weights to the engines when the push policy says so; evaluates on schedule; and records the step (logs,
checkpoint). The two scripts differ only in the :class:`~grpo_rl.run.roles.Roles` they are given
(:func:`~grpo_rl.run.roles.make_roles`):

* ``sota/grpo.py``: the source collects the batch now, in this process, with the current weights (policy lag 0);
  the weights are reloaded in place after every update.
* ``sota/grpo-async.py``: the source hands over what collector actors generated meanwhile, within
  ``pipeline.max_staleness`` versions; the weights go out every ``pipeline.push_every`` updates.

The loop composes three small objects: a :class:`~grpo_rl.run.stopping.Stopper` (``train.steps``,
``train.max_time_minutes``, Ctrl-C, SIGTERM), a :class:`~grpo_rl.run.step_log.StepLog` (each step's row, written
once) and a :class:`~grpo_rl.run.checkpoint_manager.CheckpointManager` (resume, the step boundaries, periodic and
final checkpoints: stopping checkpoints the last completed step).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from grpo_rl import trace
from grpo_rl.errors import LearnerLost, RoleFailed
from grpo_rl.rollout.evaluation import due_for_evaluation, make_eval_env
from grpo_rl.run.checkpoint_manager import CheckpointManager
from grpo_rl.run.metrics import RunLogger, pipeline_suffix
from grpo_rl.run.report import refresh_report
from grpo_rl.run.roles import Roles, make_learner, make_roles, start_roles
from grpo_rl.run.setup import make_run, make_train_env
from grpo_rl.run.step_log import RunOutcome, StepLog
from grpo_rl.run.stopping import GracefulStop, Stopper, StopRun
from grpo_rl.training.step import train_on_batch

log = logging.getLogger(__name__)


def train(cfg, run_dir: Path, mode: str, rewards: tuple = ()) -> RunOutcome:
    """Build the run and its roles, resume if asked, and run steps until the run stops; returns its outcome."""
    # Cleanup runs in reverse order of registration, every step even if an earlier one fails: stop the rollout
    # source (its actors free the cores), the final checkpoint and export of the last completed step, the logs,
    # the roles, the Ray instance this run started, the signal handlers.
    with contextlib.ExitStack() as cleanup:
        signals = GracefulStop().install()  # Ctrl-C / SIGTERM: stop at the step's next phase, checkpoint, exit
        cleanup.callback(signals.restore)
        # Create the run: validate config and run folder, allocate devices, place the roles, resolve precision;
        # then read and check the data, before any engine starts.
        run = make_run(cfg, run_dir, mode=mode, rewards=rewards)
        if cfg.report.enabled:  # registered first, so it runs last: after the logs close and trace.json is merged
            cleanup.callback(refresh_report, run.run_dir)
        if cfg.logger.trace:  # every process's spans into trace.json when the run ends (the last cleanup)
            trace.start(run.run_dir / "trace", "driver")
            cleanup.callback(write_trace, run.run_dir)
        env, eval_env = make_train_env(run), make_eval_env(run)
        # Create the roles: rollout source (engines, collectors), learner, reference, weight sync.
        start_roles(run, cleanup)
        roles = make_roles(run, env, eval_env, cleanup)
        logger = RunLogger.from_config(cfg, run.run_dir)
        cleanup.callback(logger.close)
        stopper, steps = (
            Stopper(cfg.train, signals, started=run.started),
            StepLog(cfg, run.run_dir, logger, run.tokenizer),
        )
        checkpoints = CheckpointManager(cfg, run.run_dir, roles.learner, roles.source, run.tokenizer, steps)
        # Resume (resume=auto|<checkpoint>): weights, optimizer, stream position, RNG; the engines get the weights.
        checkpoints.resume(roles.weight_sync)
        cleanup.callback(lambda: roles.learner.shutdown())  # the learner of the last restart (a second one is a no-op)
        cleanup.push(lambda *exc: finish_checkpoints(checkpoints, stopper, failure=exc[1]))
        cleanup.callback(roles.source.close)  # before the final checkpoint (a second close does nothing)
        try:
            run_healing_steps(run, roles, stopper, steps, checkpoints)
        except StopRun as e:
            print(f"stopping: {e}", flush=True)
    return steps.outcome(
        started=stopper.started,
        stopped_because=stopper.stopped_because,
        resumed_from=checkpoints.resumed_from,
        last_checkpoint=checkpoints.last_checkpoint,
    )


def finish_checkpoints(checkpoints: CheckpointManager, stopper: Stopper, failure: BaseException | None) -> bool:
    """The final checkpoint (:meth:`CheckpointManager.finish`). When the run is already ending on ``failure``, a
    role that fails the checkpoint too is logged, and ``failure`` stays what the run ends with: the checkpoint's
    error would otherwise hide why the run ended."""
    try:
        checkpoints.finish(stopper.stopped_because)
    except RoleFailed as e:
        if failure is None:
            raise
        log.warning("no final checkpoint: %s; %s", e, checkpoints.resume_note())
    return False  # ExitStack: do not swallow ``failure``


def run_healing_steps(run, roles: Roles, stopper: Stopper, steps: StepLog, checkpoints: CheckpointManager) -> None:
    """:func:`run_steps`; a learner group that loses a rank is started again from the last checkpoint, up to
    ``train.max_restarts`` times, and the steps go on (see :meth:`CheckpointManager.restart`)."""
    limit, restarts = run.cfg.train.max_restarts, 0
    while True:
        try:
            return run_steps(run.cfg, roles, stopper, steps, checkpoints)
        except LearnerLost as e:
            if restarts >= limit:
                why = (
                    "train.max_restarts=0: a lost learner rank ends the run"
                    if limit == 0
                    else f"after {restarts} restart(s), the most train.max_restarts={limit} allows"
                )
                raise LearnerLost(f"{e}; {why}") from e
            restarts += 1
            log.warning(
                "%s: starting the learner group again from the last checkpoint (%d of train.max_restarts=%d)",
                e,
                restarts,
                limit,
            )
            t0 = time.perf_counter()
            roles.learner.shutdown()
            roles.learner = make_learner(run)
            checkpoint = checkpoints.restart(roles.learner, roles.weight_sync)
            seconds = time.perf_counter() - t0
            log.warning(
                "learner group started again in %.1f s; continuing from step %d (%s)",
                seconds,
                steps.step,
                checkpoint or "the start: no checkpoint was written",
            )
            if roles.restarts is not None:
                roles.restarts.record(
                    "learner", 0, str(e), seconds, step=steps.step, checkpoint=str(checkpoint) if checkpoint else None
                )


def run_steps(cfg, roles: Roles, stopper: Stopper, steps: StepLog, checkpoints: CheckpointManager) -> None:
    """Steps until ``train.steps``, the time limit or a signal; a failed push ends the run after its step is kept."""
    source, learner, push = roles.source, roles.learner, roles.push
    stopping = lambda: stopper.should_stop() is not None  # noqa: E731
    between_phases = stopper.between_phases if push.stop_between_phases else None
    pushed = learner.version  # the policy version the engines hold
    while stopper.running(steps.step):
        t0 = time.perf_counter()
        with trace.span("wait for batch", step=steps.step + 1):
            rollout = source.next_batch(learner.version, stopping)  # G answers per prompt, rewarded, versioned
        if rollout is None:  # stopped while waiting for it
            break
        if between_phases is not None:
            between_phases("generation")
        t1 = time.perf_counter()
        batch, metrics = train_on_batch(
            learner,
            roles.reference,
            rollout.batch,
            cfg.policy,
            cfg.sampling.max_new_tokens,
            between_phases=between_phases,
        )
        step = steps.step + 1
        evaluate = not stopping() and due_for_evaluation(cfg.eval.every, step, cfg.train.steps)
        push_seconds, push_failed = 0.0, None
        try:
            if push.due(learner.version, pushed, evaluate):
                with trace.span("push", version=learner.version):
                    push_seconds = roles.weight_sync.push(learner.weights_for_push(), learner.version)
                pushed = learner.version
            if evaluate:  # the engines must hold the push before they are evaluated
                with trace.span("wait for push"):
                    push_seconds += roles.weight_sync.delivered()
        except RoleFailed as e:  # the step is trained: it is logged and checkpointed before the failure ends the run
            push_failed, evaluate = e, False
        t2 = time.perf_counter()

        step_seconds = t2 - t0
        metrics.update(rollout.metrics)
        if roles.restarts is not None:
            metrics.update(roles.restarts.metrics())
        metrics.update(
            policy_version=learner.version,
            weight_sync_seconds=push_seconds,
            step_seconds=step_seconds,
            learner_busy_fraction=(t2 - t1) / step_seconds,
            learner_idle_fraction=(t1 - t0) / step_seconds,  # waiting for the batch: nothing to train
            # an engine's time without a request, in both loops: generation seconds are per engine
            engine_idle_fraction=max(0.0, 1.0 - metrics.get("generation_seconds", 0.0) / step_seconds),
            tokens_per_second=metrics["answer_tokens"] / step_seconds,
            learner_samples_per_second=rollout.batch.batch_size[0] / step_seconds,
        )
        if evaluate:
            with trace.span("evaluate", step=step):
                metrics.update(source.evaluate(step, cfg.train.steps))
        steps.record(metrics, batch, rollout.failure_examples, console_suffix=pipeline_suffix(metrics))
        checkpoints.step_done()  # after the row: a checkpoint of a step never lacks it
        if push_failed is not None:
            raise push_failed


def write_trace(run_dir: Path) -> None:
    """Merge every process's spans into ``<run_dir>/trace.json`` (:mod:`grpo_rl.trace`)."""
    trace.stop()
    try:
        events = trace.merge(run_dir / "trace", run_dir / "trace.json")
    except OSError as e:  # a full disk: the trace is a diagnostic, the run's outcome stands
        log.warning("could not write %s: %s", run_dir / "trace.json", e)
        return
    log.info(
        "trace: %s (%d spans; open it in https://ui.perfetto.dev or chrome://tracing)", run_dir / "trace.json", events
    )
