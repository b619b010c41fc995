"""What each step leaves in the logs, written once per step, and the run's summary at the end.

:meth:`StepLog.record` is shared by both loops, so that what a step leaves behind does not depend on the loop
that ran it: its metrics row, reward failures, console line and sample table. It counts the steps it recorded
and keeps the reward curve for the summary; a checkpoint saves both and a resume (or a restart of the learner)
puts them back with :meth:`StepLog.rewind`, which also cuts the logs back to that step
(:meth:`grpo_rl.run.metrics.RunLogger.rewind`), so a step logged after the last checkpoint is not logged twice.
With ``report.every = N > 0`` every N-th step also rewrites ``report.html`` (:mod:`grpo_rl.run.report`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_rl.run.metrics import RunLogger, console_line, log_reward_failures, read_jsonl
from grpo_rl.run.report import refresh_report
from grpo_rl.run.sample_log import TokenDetail

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOutcome:
    """What the loop hands back once it has cleaned up (see :class:`grpo_rl.api.RunResult`)."""

    run_dir: Path
    steps: int
    final_reward: float
    stopped_because: str | None
    summary: str


class StepLog:
    """The steps' rows and the reward curve of one run."""

    def __init__(self, cfg, run_dir: Path, logger: RunLogger, tokenizer=None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.logger = logger
        # with a tokenizer, the logged samples carry their groups' answers token by token (the report colours them)
        self.detail = TokenDetail.from_config(tokenizer, cfg.policy, cfg.sampling) if tokenizer is not None else None
        self.report_every = cfg.report.every if cfg.report.enabled else 0
        self.step = 0
        self.rewards: list[float] = []

    def record(self, metrics: dict, batch, failure_examples: list[dict] = (), console_suffix: str = "") -> None:
        """Log the step after :attr:`step` (metrics, reward failures, console line, sample table), then count it."""
        step = self.step + 1
        self.logger.log(step, metrics)
        self.logger.log_trained(step, batch)
        log_reward_failures(self.run_dir, step, list(failure_examples))
        log.info(console_line(step, self.cfg.train.steps, metrics) + console_suffix)
        every = self.cfg.logger.examine_every
        if self.cfg.logger.num_examine and (step == 1 or step % every == 0):
            reward_keys = [k for k in batch.keys() if isinstance(k, str) and k.startswith("reward_")]
            self.logger.log_samples(step, batch, self.cfg.logger.num_examine, reward_keys, self.detail)
        self.step = step  # counted once its row is written, so a checkpoint of a step never lacks its row
        self.rewards.append(float(metrics["reward_mean"]))
        if self.report_every > 0 and step % self.report_every == 0:
            refresh_report(self.run_dir)

    def rewind(self, step: int, rewards: list[float]) -> None:
        """Go back to ``step`` with the reward curve up to it, and cut the logs back to it."""
        self.step, self.rewards = step, list(rewards)
        self.logger.rewind(step)

    def result(self) -> float:
        """The last step's mean reward (NaN before the first step): what a ``--multirun`` sweep compares."""
        return self.rewards[-1] if self.rewards else float("nan")

    def outcome(
        self, *, started: float, stopped_because: str | None, resumed_from: Path | None, last_checkpoint: Path | None
    ) -> RunOutcome:
        """The run's outcome and summary lines, once the final checkpoint and export are written."""
        k = max(1, min(5, len(self.rewards) // 3))
        start = sum(self.rewards[:k]) / k if self.rewards else float("nan")
        end = sum(self.rewards[-k:]) / k if self.rewards else float("nan")
        lines = [
            f"reward: start {start:.3f} (mean of first {k} steps) -> end {end:.3f} (mean of last {k} steps)",
            f"steps: {self.step} in {(time.monotonic() - started) / 60:.1f} min"
            + (f" (stopped early: {stopped_because})" if stopped_because else ""),
        ]
        evals = [r for r in read_jsonl(self.run_dir / "metrics.jsonl") if "eval/accuracy" in r]
        if evals:
            last = evals[-1]
            extra = "".join(f", {k.split('/', 1)[1]} {v:.3f}" for k, v in last.items() if k.startswith("eval/pass@"))
            lines.append(f"eval at step {last['step']}: accuracy {last['eval/accuracy']:.3f}{extra}")
        lines += [f"run dir: {self.run_dir}", f"metrics: {self.run_dir / 'metrics.jsonl'}"]
        if resumed_from is not None:
            lines.append(f"resumed from: {resumed_from}")
        if last_checkpoint is not None:
            lines.append(f"checkpoint: {last_checkpoint}")
        if (self.run_dir / "final_model").exists():
            lines.append(f"final model (HF folder): {self.run_dir / 'final_model'}")
        return RunOutcome(self.run_dir, self.step, self.result(), stopped_because, "\n".join(lines))
