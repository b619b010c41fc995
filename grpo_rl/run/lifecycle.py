"""Run lifecycle shared by both loops: run directory, resume, periodic and final checkpoints, export, the summary.

Exact resume (``sota/grpo.py``): a run killed at any moment and restarted with ``resume=auto output_dir=<same
dir>`` logs the same losses and rewards, step by step, as a run that was never stopped
(``tests/integration/test_resume.py``). The asynchronous loop resumes the weights, optimizer, RNG and the
collectors' data position and round (so prompts and sampling seeds go on where the collectors were), but the
batches still in its buffer at the checkpoint are not trained on, and its interleaving is not deterministic.
What makes the synchronous resume exact:

* a checkpoint holds everything the next step depends on (see :mod:`grpo_rl.run.checkpoint`); the engine's
  sampling seeds are derived from ``(seed, step)`` by the collector, so they need no state;
* checkpoints are taken at step boundaries only, and a step ends (:meth:`RunState.record_step`) by logging its
  row first, then marking the boundary, then checkpointing: a checkpoint of step ``k`` always has its row.
  When the loop stops mid-step (a crash, a signal, the time limit), the final checkpoint is written only if
  the learner has not been updated in that step, and then with the data position and RNG states of the last
  step boundary (:meth:`RunState.finish`);
* the resumed run cuts its logs back to the checkpoint's step (:meth:`grpo_rl.run.metrics.RunLogger.rewind`), so a
  step logged after the last checkpoint by the killed run is not logged twice.

Stopping: SIGINT (Ctrl-C) and SIGTERM (a scheduler's preemption, ``timeout``) and ``train.max_time_minutes`` are
checked before each step and between its phases (:meth:`RunState.between_phases`): before the learner update
the step is abandoned (:class:`StopRun`), after it the step is finished. Either way the run stops within one
phase, checkpoints its last completed step and says so. A second signal stops at once.
"""
from __future__ import annotations

import copy
import logging
import signal
import threading
import time
from pathlib import Path

from omegaconf import OmegaConf

from grpo_rl.run.checkpoint import (
    CheckpointDamagedError,
    Checkpointer,
    checkpoint_step,
    export_model_atomic,
    load_model_weights,
    load_trainer_state,
    rng_state,
    saved_model_name,
    set_rng_state,
    verify_checkpoint,
)
from grpo_rl.errors import RunFolderError
from grpo_rl.run.metrics import RunLogger, console_line, log_reward_failures, read_jsonl

log = logging.getLogger(__name__)

# Keys that may change between a run and its resumption without changing what is computed.
_RESUMABLE_CHANGES = ("resume", "output_dir", "train.steps", "train.prompt_epochs", "train.max_time_minutes",
                      "train.checkpoint_frequency", "train.keep_checkpoints", "train.export_checkpoints", "logger.",
                      "eval.", "model.cache_dir")


def find_resume_checkpoint(cfg, checkpointer: Checkpointer) -> Path | None:
    """The checkpoint ``cfg.resume`` names, checked against its manifest before anything of it is loaded; None
    without ``resume`` or, with ``resume=auto``, when the run has no checkpoint yet.

    ``resume=auto`` takes the newest intact checkpoint, warning once about each newer damaged one it passes over.
    ``resume=<folder>`` takes that folder or nothing: the user asked for that one.

    Raises:
        RunFolderError: ``resume=<folder>`` is not a checkpoint or is damaged (the message names the file), or
            every checkpoint of the run is damaged.
    """
    if not cfg.resume:
        return None
    if cfg.resume == "auto":
        try:
            return checkpointer.latest_intact()
        except CheckpointDamagedError as e:
            raise CheckpointDamagedError(f"resume=auto: {e}") from None
    path = Path(cfg.resume).expanduser()
    if not (path / "trainer_state.pt").exists():
        raise RunFolderError(
            f"resume={cfg.resume}: not a checkpoint folder (expected {path}/trainer_state.pt); pass a "
            f"<run dir>/checkpoints/step_NNNNNNNN folder, or resume=auto output_dir=<run dir> for the newest one")
    try:
        verify_checkpoint(path)
    except CheckpointDamagedError as e:
        raise CheckpointDamagedError(f"resume={cfg.resume}: {e}") from None
    return path


def check_output_dir(run_dir: Path) -> None:
    """Raise :class:`RunFolderError` if the run folder cannot be made because it, or a folder above it, is a
    file. Hydra makes the folder before the run starts, so the entry scripts call this first (with the
    command line's ``output_dir``) and :func:`check_run_folder` again."""
    run_dir = Path(run_dir).expanduser()
    for path in (run_dir, *run_dir.parents):
        if path.exists() or path.is_symlink():
            if path.is_dir():
                return
            kind = "a file" if path.is_file() else "not a folder"
            where = f"is {kind}" if path == run_dir else f"is inside {path}, which is {kind}"
            raise RunFolderError(
                f"output_dir={run_dir} {where}, so the run cannot write there; set output_dir to a folder (it is "
                "made if it does not exist), or move that file away")


def check_run_folder(cfg, run_dir: Path) -> None:
    """Refuse a run folder that would mix two runs or cannot be one, before anything starts.

    The folder, or one above it, must not be a file. A fresh run (no ``resume``) in a folder that holds another
    run's checkpoints or metrics would overwrite its logs, and a later ``resume=auto`` would continue the other run.
    A resumed run's checkpoint must be intact (:func:`find_resume_checkpoint`) and must use the model it was
    trained with.
    """
    check_output_dir(run_dir)
    checkpointer_root = run_dir / "checkpoints"
    checkpoints = sorted(checkpointer_root.glob("step_*")) if checkpointer_root.is_dir() else []
    metrics = run_dir / "metrics.jsonl"
    if not cfg.resume:
        if checkpoints or (metrics.is_file() and metrics.stat().st_size > 0):
            held = f"checkpoints up to {checkpoints[-1].name}" if checkpoints else "the metrics of an earlier run"
            raise RunFolderError(
                f"output_dir={run_dir} already holds {held}. To continue that run pass resume=auto; to start a "
                f"new one choose another output_dir (or leave it unset for a fresh outputs/DATE/TIME folder)")
        return
    checkpoint = find_resume_checkpoint(cfg, Checkpointer(run_dir, keep=cfg.train.keep_checkpoints))
    if checkpoint is None:
        return
    saved = saved_model_name(checkpoint)
    if saved is not None and saved != cfg.model.name:
        raise RunFolderError(
            f"resume={cfg.resume}: {checkpoint} was trained with model.name={saved}, not {cfg.model.name}. Resume "
            f"with model.name={saved}, or start a new run in another output_dir")


class StopRun(Exception):
    """The run must stop in the middle of a step (signal, time limit); raised before the learner update."""


class GracefulStop:
    """First SIGINT (Ctrl-C) or SIGTERM: stop at the next phase boundary; a second one stops at once.

    :meth:`install` in the main thread before anything slow starts, check :attr:`requested` (the signal's name,
    or None), :meth:`restore` the previous handlers at the end.
    """

    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def install(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        log.warning("%s: stopping at the next phase boundary and checkpointing the last completed step (send it "
                    "again to stop at once)", self.requested)


def config_changes(saved_yaml: str, cfg) -> list[str]:
    """``key: old -> new`` for every setting that differs from the saved config and matters for resuming."""
    old = _flatten(OmegaConf.to_container(OmegaConf.create(saved_yaml), resolve=False))
    new = _flatten(OmegaConf.to_container(cfg, resolve=True))
    if "train.updates_per_batch" not in old and "train.epochs" in old:  # saved before train.epochs was renamed
        old["train.updates_per_batch"], old["train.epochs"] = old["train.epochs"], None
    changes = []
    for key in sorted(set(old) | set(new)):
        if key.startswith(_RESUMABLE_CHANGES) or key in _RESUMABLE_CHANGES:
            continue
        if old.get(key) != new.get(key):
            changes.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return changes


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _learner_fingerprint(learner) -> tuple:
    """Changes whenever the learner's weights or optimizer state may have changed."""
    return (learner.version, getattr(learner, "skipped_steps", None))


class RunState:
    """Tracks the step, saves checkpoints, resumes, exports, and remembers the reward curve for the summary.

    Args:
        cfg: the run config.
        run_dir: the run folder.
        logger: the run's logger.
    """

    def __init__(self, cfg, run_dir: Path, logger: RunLogger, stop: GracefulStop | None = None,
                 started: float | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.logger = logger
        self.stop = stop
        self.checkpointer = Checkpointer(run_dir, keep=cfg.train.keep_checkpoints)
        self.step = 0
        self.rewards: list[float] = []
        self.started = time.monotonic() if started is None else started
        self.last_checkpoint: Path | None = None
        self.resumed_from: Path | None = None
        self.stopped_because: str | None = None
        self._first_step: int | None = None
        self._step_started = self.started
        self._boundary: tuple | None = None  # (learner fingerprint, env state, RNG states) at the last step end
        self._start: tuple | None = None  # (stream position, RNG states) of a run that started without a checkpoint

    def resume(self, learner, source, weight_sync) -> Path | None:
        """Continue from the checkpoint ``cfg.resume`` names, if any: weights, trainer state, the rollout
        source's stream position (what was consumed) and RNG; push the weights through ``weight_sync``; cut the
        logs back to the checkpoint's step. Call once, before the loop.
        """
        checkpoint = find_resume_checkpoint(self.cfg, self.checkpointer)
        if checkpoint is None and self.cfg.resume:
            log.info("resume=auto: no checkpoint in %s; starting fresh", self.checkpointer.root)
        if checkpoint is not None:
            load_model_weights(checkpoint, learner.model)
            self.restore(checkpoint, learner, source)
            weight_sync.push(learner.weights_for_push(), learner.version)
            self.resumed_from = checkpoint
        else:  # what a learner that is started again without a checkpoint goes back to
            self._start = (copy.deepcopy(source.state_dict()), rng_state())
        if self.cfg.resume:
            self.logger.rewind(self.step)
        self._mark_boundary(learner, source)
        return checkpoint

    def restart(self, learner, source, weight_sync) -> Path | None:
        """Take the run back to its newest checkpoint (or its start, without one), for ``learner``, a learner
        group started again after it lost a rank: weights, optimizer, stream position (``source`` drops what it
        collected ahead) and RNG; the engines get the weights; the logs are cut back to that step, so every step
        is logged once. Returns the checkpoint."""
        checkpoint = self.last_checkpoint or self.resumed_from
        source.rewind()
        if checkpoint is not None:
            load_model_weights(checkpoint, learner.model)
            self.restore(checkpoint, learner, source)
        else:
            stream, rng = self._start
            source.load_state_dict(copy.deepcopy(stream))
            set_rng_state(rng)
            self.step, self.rewards = 0, []
        weight_sync.push(learner.weights_for_push(), learner.version)
        self.logger.rewind(self.step)
        self._mark_boundary(learner, source)
        return checkpoint

    def restore(self, checkpoint: Path, learner, source) -> None:
        """Load trainer state written by :meth:`save` (the model weights are loaded by the caller)."""
        state = load_trainer_state(checkpoint)
        if state.get("config"):
            changes = config_changes(state["config"], self.cfg)
            if changes:
                log.warning("resuming %s with changed settings (the run will not match an uninterrupted one):\n  %s",
                            checkpoint, "\n  ".join(changes))
        learner.load_state_dict(state["learner"])
        stream = dict(state["env"])
        stream.setdefault("next_index", int(state["step"]))  # checkpoints from before the stream record
        source.load_state_dict(stream)
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.rewards = list(state.get("rewards", []))
        log.info("resumed from %s at step %d (policy version %d)", checkpoint, self.step, learner.version)

    def should_stop(self) -> str | None:
        """Why the run must stop now (a signal, the time limit), or None."""
        if self.stopped_because is None:
            if self.stop is not None and self.stop.requested:
                self.stopped_because = f"{self.stop.requested} received"
            elif self.out_of_time():
                self.stopped_because = f"train.max_time_minutes={self.cfg.train.max_time_minutes} reached"
        return self.stopped_because

    def running(self) -> bool:
        """The loop's condition: steps left and no reason to stop. Call once at the top of every step."""
        if self.step >= self.cfg.train.steps or self.should_stop() is not None:
            return False
        self._step_started = time.monotonic()
        if self._first_step is None:  # the slowest step (kernels compile, caches fill): show its phases
            self._first_step = self.step + 1
            log.info("step %d/%d started: generation, then reference scoring and training (%.0f s since start)",
                     self._first_step, self.cfg.train.steps, time.monotonic() - self.started)
        return True

    def between_phases(self, phase: str) -> None:
        """Call between the phases of a step that come before the learner update: raises :class:`StopRun`
        (the step is abandoned) when the run must stop."""
        if self.step + 1 == self._first_step:
            log.info("step %d: %s done (%.1f s into the step)", self._first_step, phase,
                     time.monotonic() - self._step_started)
        reason = self.should_stop()
        if reason is not None:
            raise StopRun(f"{reason} during step {self.step + 1}, after {phase}: step {self.step + 1} abandoned")

    def record_step(self, learner, source, tokenizer, metrics: dict, batch, failure_examples: list[dict] = (),
                    console_suffix: str = "") -> None:
        """End a step: log it (metrics, reward failures, console line, sample table), then mark the step
        boundary, then checkpoint on schedule. Call once per step, after the learner update and the weight push.

        Shared by both loops, so that what a step leaves behind does not depend on the loop that ran it. The
        row is written before the boundary moves, so a checkpoint of a step never lacks its row.
        """
        step = self.step + 1
        self.logger.log(step, metrics)
        self.logger.log_trained(step, batch)
        log_reward_failures(self.run_dir, step, list(failure_examples))
        log.info(console_line(step, self.cfg.train.steps, metrics) + console_suffix)
        every = self.cfg.logger.examine_every
        if self.cfg.logger.num_examine and (step == 1 or step % every == 0):
            reward_keys = [k for k in batch.keys() if isinstance(k, str) and k.startswith("reward_")]
            self.logger.log_samples(step, batch, self.cfg.logger.num_examine, reward_keys)
        self.step = step
        self.rewards.append(float(metrics["reward_mean"]))
        self._mark_boundary(learner, source)
        if self.should_checkpoint():
            self.save(learner, source, tokenizer)

    def _mark_boundary(self, learner, source) -> None:
        self._boundary = (_learner_fingerprint(learner), copy.deepcopy(source.state_dict()), rng_state())

    def save(self, learner, source, tokenizer) -> Path:
        """Checkpoint the current step (call at a step boundary)."""
        return self._save(learner, source.state_dict(), tokenizer)

    def _save(self, learner, env_state: dict, tokenizer, rng: dict | None = None) -> Path:
        config_yaml = OmegaConf.to_yaml(self.cfg)
        state = {"learner": learner.state_dict(), "env": env_state, "rewards": list(self.rewards),
                 "config": config_yaml}
        if rng is not None:
            state["rng"] = rng
        self.last_checkpoint = self.checkpointer.save(
            self.step, learner.model, tokenizer, state, export_model_dir=self.cfg.train.export_checkpoints,
            config_yaml=config_yaml)
        return self.last_checkpoint

    def should_checkpoint(self) -> bool:
        freq = self.cfg.train.checkpoint_frequency
        return bool(freq) and self.step % freq == 0

    def out_of_time(self) -> bool:
        limit = self.cfg.train.max_time_minutes
        return limit is not None and (time.monotonic() - self.started) / 60 >= limit

    def finish(self, learner, source, tokenizer) -> None:
        """The final checkpoint and export; register it as a cleanup callback of the loop.

        The checkpoint is always that of the last step boundary (its data position and RNG states), so a run
        that stopped mid-step (a crash, a signal, the time limit) still resumes exactly. If the learner was
        updated in the unfinished step, the weights no longer match that boundary: the last periodic checkpoint
        then stands, and nothing is exported.
        """
        if self.step == 0 or self._boundary is None:
            return
        if getattr(learner, "lost", False):  # a learner group without one of its ranks holds no usable state
            since = self.last_checkpoint or self.resumed_from
            log.warning("the learner lost a rank: no final checkpoint; resume=auto %s",
                        f"continues from {since}" if since else "starts over (no checkpoint was written: see "
                        "train.checkpoint_frequency)")
            return
        fingerprint, env_state, rng = self._boundary
        if _learner_fingerprint(learner) != fingerprint:
            since = (f"continues from {self.last_checkpoint}" if self.last_checkpoint is not None
                     else "starts over (no checkpoint was written: see train.checkpoint_frequency)")
            log.warning("stopped in the middle of step %d after the learner had been updated: no checkpoint "
                        "written; resume=auto %s", self.step + 1, since)
            return
        saved_step = checkpoint_step(self.last_checkpoint) if self.last_checkpoint is not None else None
        if saved_step != self.step:
            self._save(learner, env_state, tokenizer, rng=rng)
        self.export_final(learner, tokenizer)
        if self.stopped_because is not None:
            log.warning("stopped: %s; step %d is the last completed step, checkpointed at %s (continue with "
                        "resume=auto output_dir=%s)", self.stopped_because, self.step, self.last_checkpoint,
                        self.run_dir)

    def export_final(self, learner, tokenizer) -> Path:
        """The policy as an HF folder (merged, for LoRA) at ``<run_dir>/final_model``, replaced atomically."""
        return export_model_atomic(learner.model, tokenizer, self.run_dir / "final_model")

    def result(self) -> float:
        """The last step's mean reward (NaN before the first step): what a ``--multirun`` sweep compares."""
        return self.rewards[-1] if self.rewards else float("nan")

    def summary(self) -> str:
        k = max(1, min(5, len(self.rewards) // 3))
        start = sum(self.rewards[:k]) / k if self.rewards else float("nan")
        end = sum(self.rewards[-k:]) / k if self.rewards else float("nan")
        lines = [
            f"reward: start {start:.3f} (mean of first {k} steps) -> end {end:.3f} (mean of last {k} steps)",
            f"steps: {self.step} in {(time.monotonic() - self.started) / 60:.1f} min"
            + (f" (stopped early: {self.stopped_because})" if self.stopped_because else ""),
        ]
        evals = [r for r in read_jsonl(self.run_dir / "metrics.jsonl") if "eval/accuracy" in r]
        if evals:
            last = evals[-1]
            extra = "".join(f", {k.split('/', 1)[1]} {v:.3f}" for k, v in last.items() if k.startswith("eval/pass@"))
            lines.append(f"eval at step {last['step']}: accuracy {last['eval/accuracy']:.3f}{extra}")
        lines += [f"run dir: {self.run_dir}", f"metrics: {self.run_dir / 'metrics.jsonl'}"]
        if self.resumed_from is not None:
            lines.append(f"resumed from: {self.resumed_from}")
        if self.last_checkpoint is not None:
            lines.append(f"checkpoint: {self.last_checkpoint}")
        if (self.run_dir / "final_model").exists():
            lines.append(f"final model (HF folder): {self.run_dir / 'final_model'}")
        return "\n".join(lines)
