"""Run lifecycle shared by both loops: run directory, resume, periodic and final checkpoints, the summary."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import OmegaConf

from grpo_rl.checkpoint import Checkpointer, export_model, load_trainer_state, set_rng_state
from grpo_rl.metrics import RunLogger

log = logging.getLogger(__name__)


def hydra_run_dir(cfg) -> Path:
    """``cfg.output_dir`` if set, else the folder Hydra made for this job (outputs/DATE/TIME)."""
    if cfg.output_dir:
        return Path(cfg.output_dir).expanduser().resolve()
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def find_resume_checkpoint(cfg, checkpointer: Checkpointer) -> Path | None:
    if not cfg.resume:
        return None
    if cfg.resume == "auto":
        found = checkpointer.latest()
        if found is None:
            log.info("resume=auto: no checkpoint in %s; starting fresh", checkpointer.root)
        return found
    path = Path(cfg.resume).expanduser()
    if not (path / "trainer_state.pt").exists():
        raise FileNotFoundError(f"resume={cfg.resume}: not a checkpoint folder (expected {path}/trainer_state.pt)")
    return path


class RunState:
    """Tracks the step, saves checkpoints, and remembers the reward curve for the closing summary.

    Args:
        cfg: the run config.
        run_dir: the run folder.
        logger: the run's logger.
    """

    def __init__(self, cfg, run_dir: Path, logger: RunLogger):
        self.cfg = cfg
        self.run_dir = run_dir
        self.logger = logger
        self.checkpointer = Checkpointer(run_dir, keep=cfg.train.keep_checkpoints)
        self.step = 0
        self.rewards: list[float] = []
        self.started = time.monotonic()
        self.last_checkpoint: Path | None = None

    def restore(self, checkpoint: Path, learner, env) -> None:
        """Load trainer state written by :meth:`save` (the model weights are loaded by the caller)."""
        state = load_trainer_state(checkpoint)
        learner.load_state_dict(state["learner"])
        env.load_state_dict(state["env"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.rewards = list(state.get("rewards", []))
        log.info("resumed from %s at step %d (policy version %d)", checkpoint, self.step, learner.version)

    def save(self, learner, env, tokenizer, extra: dict | None = None) -> Path:
        state = {"learner": learner.state_dict(), "env": env.state_dict(), "rewards": list(self.rewards),
                 "config": OmegaConf.to_yaml(self.cfg), **(extra or {})}
        self.last_checkpoint = self.checkpointer.save(self.step, learner.model, tokenizer, state)
        return self.last_checkpoint

    def should_checkpoint(self) -> bool:
        freq = self.cfg.train.checkpoint_frequency
        return bool(freq) and self.step % freq == 0

    def out_of_time(self) -> bool:
        limit = self.cfg.train.max_time_minutes
        return limit is not None and (time.monotonic() - self.started) / 60 >= limit

    def export_final(self, learner, tokenizer) -> Path:
        return export_model(learner.model, tokenizer, self.run_dir / "final_model")

    def summary(self) -> str:
        k = max(1, min(5, len(self.rewards) // 3))
        start = sum(self.rewards[:k]) / k if self.rewards else float("nan")
        end = sum(self.rewards[-k:]) / k if self.rewards else float("nan")
        lines = [
            f"reward: start {start:.3f} (mean of first {k} steps) -> end {end:.3f} (mean of last {k} steps)",
            f"steps: {self.step} in {(time.monotonic() - self.started) / 60:.1f} min",
            f"run dir: {self.run_dir}",
            f"metrics: {self.run_dir / 'metrics.jsonl'}",
        ]
        if self.last_checkpoint is not None:
            lines.append(f"checkpoint: {self.last_checkpoint}")
        if (self.run_dir / "final_model").exists():
            lines.append(f"final model (HF folder): {self.run_dir / 'final_model'}")
        return "\n".join(lines)
