"""The run's checkpoints at step boundaries: resume, restart after a lost learner rank, periodic and final saves.

As prime-rl's ``trainer/ckpt.py``: :class:`CheckpointManager` is built once with what a checkpoint holds (the
learner, the rollout source, the tokenizer, the :class:`~grpo_rl.run.step_log.StepLog` with the step and the reward
curve), then the loop calls :meth:`~CheckpointManager.resume`, :meth:`~CheckpointManager.step_done` and
:meth:`~CheckpointManager.finish`. What is on disk is :mod:`grpo_rl.run.checkpoint`'s.

Exact resume (``sota/grpo.py``): a run killed at any moment and restarted with ``resume=auto output_dir=<same
dir>`` logs the same losses and rewards, step by step, as a run that was never stopped
(``tests/integration/test_resume.py``). The asynchronous loop resumes the weights, optimizer, RNG and the
collectors' data position and round (so prompts and sampling seeds go on where the collectors were), but the
batches still in its buffer at the checkpoint are not trained on, and its interleaving is not deterministic.
What makes the synchronous resume exact:

* a checkpoint holds everything the next step depends on (see :mod:`grpo_rl.run.checkpoint`); the engine's
  sampling seeds are derived from ``(seed, step)`` by the collector, so they need no state;
* checkpoints are taken at step boundaries only, and a step ends by logging its row
  (:meth:`grpo_rl.run.step_log.StepLog.record`), then marking the boundary, then checkpointing
  (:meth:`CheckpointManager.step_done`): a checkpoint of step ``k`` always has its row. When the loop stops
  mid-step (a crash, a signal, the time limit), the final checkpoint is written only if the learner has not been
  updated in that step, and then with the data position and RNG states of the last step boundary
  (:meth:`CheckpointManager.finish`);
* the resumed run cuts its logs back to the checkpoint's step (:meth:`grpo_rl.run.step_log.StepLog.rewind`), so
  a step logged after the last checkpoint by the killed run is not logged twice.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

from omegaconf import OmegaConf

from grpo_rl import trace
from grpo_rl.run.checkpoint import (
    Checkpointer,
    checkpoint_step,
    export_model_atomic,
    load_model_weights,
    load_trainer_state,
    rng_state,
    set_rng_state,
)
from grpo_rl.run.lifecycle import config_changes, find_resume_checkpoint
from grpo_rl.run.step_log import StepLog
from grpo_rl.training.protocols import LearnerProtocol

log = logging.getLogger(__name__)


def _learner_fingerprint(learner: LearnerProtocol) -> tuple:
    """Changes whenever the learner's weights or optimizer state may have changed."""
    return (learner.version, learner.skipped_steps)


class CheckpointManager:
    """Saves and restores one run's learner, rollout source position, RNG states, step and reward curve.

    Args:
        source: the rollout source (``state_dict``, ``load_state_dict``, ``rewind``).
        steps: the step log, whose step and reward curve a checkpoint holds.
    """

    def __init__(self, cfg, run_dir: Path, learner: LearnerProtocol, source, tokenizer, steps: StepLog):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.learner, self.source, self.tokenizer, self.steps = learner, source, tokenizer, steps
        self.store = Checkpointer(run_dir, keep=cfg.train.keep_checkpoints)
        self.last_checkpoint: Path | None = None
        self.resumed_from: Path | None = None
        self._boundary: tuple | None = None  # (learner fingerprint, source state, RNG states) at the last step end
        self._start: tuple | None = None  # (source state, RNG states) of a run that started without a checkpoint

    def resume(self, weight_sync) -> Path | None:
        """Continue from the checkpoint ``cfg.resume`` names, if any (weights, trainer state, stream position,
        RNG), push the weights through ``weight_sync`` and cut the logs back to its step. Call once, before the loop.
        """
        checkpoint = find_resume_checkpoint(self.cfg, self.store)
        if checkpoint is None and self.cfg.resume:
            log.info("resume=auto: no checkpoint in %s; starting fresh", self.store.root)
        step, rewards = 0, []
        if checkpoint is not None:
            load_model_weights(checkpoint, self.learner.model)
            step, rewards = self._restore(checkpoint)
            weight_sync.push(self.learner.weights_for_push(), self.learner.version)
            self.resumed_from = checkpoint
        else:  # what a learner that is started again without a checkpoint goes back to
            self._start = (copy.deepcopy(self.source.state_dict()), rng_state())
        if self.cfg.resume:
            self.steps.rewind(step, rewards)
        self._mark_boundary()
        return checkpoint

    def restart(self, learner: LearnerProtocol, weight_sync) -> Path | None:
        """Take the run back to its newest checkpoint (or its start) for ``learner``, a learner group started again
        after it lost a rank, give the engines its weights and cut the logs back to it; returns the checkpoint."""
        self.learner = learner
        checkpoint = self.last_checkpoint or self.resumed_from
        self.source.rewind()
        if checkpoint is not None:
            load_model_weights(checkpoint, learner.model)
            step, rewards = self._restore(checkpoint)
        else:
            stream, rng = self._start
            self.source.load_state_dict(copy.deepcopy(stream))
            set_rng_state(rng)
            step, rewards = 0, []
        weight_sync.push(learner.weights_for_push(), learner.version)
        self.steps.rewind(step, rewards)
        self._mark_boundary()
        return checkpoint

    def _restore(self, checkpoint: Path) -> tuple[int, list[float]]:
        """Load the trainer state written by :meth:`save` (the weights are loaded by the caller); returns the
        checkpoint's step and reward curve."""
        state = load_trainer_state(checkpoint)
        if state.get("config"):
            changes = config_changes(state["config"], self.cfg)
            if changes:
                log.warning(
                    "resuming %s with changed settings (the run will not match an uninterrupted one):\n  %s",
                    checkpoint,
                    "\n  ".join(changes),
                )
        self.learner.load_state_dict(state["learner"])
        stream = dict(state["env"])
        stream.setdefault("next_index", int(state["step"]))  # checkpoints from before the stream record
        self.source.load_state_dict(stream)
        set_rng_state(state["rng"])
        log.info("resumed from %s at step %d (policy version %d)", checkpoint, int(state["step"]), self.learner.version)
        return int(state["step"]), list(state.get("rewards", []))

    def step_done(self) -> None:
        """Mark the step boundary :attr:`StepLog.step` just reached, then checkpoint on schedule. Call once per
        step, after :meth:`StepLog.record`."""
        self._mark_boundary()
        freq = self.cfg.train.checkpoint_frequency
        if freq and self.steps.step % freq == 0:
            self.save()

    def _mark_boundary(self) -> None:
        self._boundary = (_learner_fingerprint(self.learner), copy.deepcopy(self.source.state_dict()), rng_state())

    def save(self) -> Path:
        """Checkpoint the current step (call at a step boundary)."""
        return self._save(self.source.state_dict())

    def _save(self, env_state: dict, rng: dict | None = None) -> Path:
        with trace.span("checkpoint", step=self.steps.step):
            return self._write(env_state, rng)

    def _write(self, env_state: dict, rng: dict | None) -> Path:
        config_yaml = OmegaConf.to_yaml(self.cfg)
        state = {
            "learner": self.learner.state_dict(),
            "env": env_state,
            "rewards": list(self.steps.rewards),
            "config": config_yaml,
        }
        if rng is not None:
            state["rng"] = rng
        self.last_checkpoint = self.store.save(
            self.steps.step,
            self.learner.model,
            self.tokenizer,
            state,
            export_model_dir=self.cfg.train.export_checkpoints,
            config_yaml=config_yaml,
        )
        return self.last_checkpoint

    def finish(self, stopped_because: str | None = None) -> None:
        """The final checkpoint and export, at the last step boundary; register it as a cleanup callback of the
        loop (``stopped_because``: why a run stopped early)."""
        step = self.steps.step
        if step == 0 or self._boundary is None:
            return
        if self.learner.lost:  # a learner group without one of its ranks holds no usable state
            log.warning("the learner lost a rank: no final checkpoint; %s", self.resume_note())
            return
        # The boundary's data position and RNG states, so a run stopped mid-step still resumes exactly; but a learner
        # updated in the unfinished step no longer matches it: the last periodic checkpoint stands, nothing exported.
        fingerprint, env_state, rng = self._boundary
        if _learner_fingerprint(self.learner) != fingerprint:
            log.warning(
                "stopped in the middle of step %d after the learner had been updated: no checkpoint written; %s",
                step + 1,
                self.resume_note(),
            )
            return
        saved_step = checkpoint_step(self.last_checkpoint) if self.last_checkpoint is not None else None
        if saved_step != step:
            self._save(env_state, rng=rng)
        self.export_final()
        if stopped_because is not None:
            log.warning(
                "stopped: %s; step %d is the last completed step, checkpointed at %s (continue with "
                "resume=auto output_dir=%s)",
                stopped_because,
                step,
                self.last_checkpoint,
                self.run_dir,
            )

    def resume_note(self) -> str:
        """Where ``resume=auto`` would continue this run from, for a message that no checkpoint was written now."""
        since = self.last_checkpoint or self.resumed_from
        if since is None:
            return "resume=auto starts over (no checkpoint was written: see train.checkpoint_frequency)"
        return f"resume=auto continues from {since}"

    def export_final(self) -> Path:
        """The policy as an HF folder (merged, for LoRA) at ``<run_dir>/final_model``, replaced atomically."""
        return export_model_atomic(self.learner.model, self.tokenizer, self.run_dir / "final_model")
