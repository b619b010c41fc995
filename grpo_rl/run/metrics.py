"""Run logging: a JSONL file always, wandb when asked (offline unless a key is set), CSV and TensorBoard
on request, and a console line.

Every step writes one JSON object to ``<run_dir>/metrics.jsonl``; sample tables go to
``<run_dir>/samples.jsonl`` and, one line each, to the console (:mod:`grpo_rl.run.sample_log`); ``logger.csv`` adds
``metrics.csv`` and ``logger.tensorboard`` adds ``<run_dir>/tensorboard/``. A resumed run cuts all of them back to its
checkpoint's step (:meth:`RunLogger.rewind`). wandb is imported lazily, runs in offline mode when no ``WANDB_API_KEY``
is set (``WANDB_MODE`` still wins if the user set it), and writes under ``<run_dir>/wandb``.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from grpo_rl.rollout.stats import first_rows
from grpo_rl.run.sample_log import TokenDetail, examine_rows, group_answers, sample_line, sample_record

log = logging.getLogger(__name__)

CONSOLE_KEYS = (
    ("reward_mean", "reward {:.3f}"),
    ("reward_correct_mean", "acc {:.3f}"),
    ("reward_format_mean", "fmt {:.3f}"),
    ("reward_thinking_mean", "think {:.3f}"),
    ("reward_inst_strict_mean", "inst {:.3f}"),
    ("reward_prompt_strict_mean", "prompt {:.3f}"),
    ("eval/accuracy", "eval acc {:.3f}"),
    ("kl_ref", "kl {:.4f}"),
    ("clip_fraction", "clip {:.3f}"),
    ("response_length_mean", "len {:.0f}"),
    ("grad_norm", "gnorm {:.3f}"),
    ("tokens_per_second", "tok/s {:.0f}"),
    ("step_seconds", "{:.1f}s"),
)


class RunLogger:
    """Writes metrics and samples for one run (JSONL always; wandb, CSV and TensorBoard when asked).

    Args:
        backend: ``"wandb"`` or ``"none"``.
        resume: append to existing files instead of starting new ones (call :meth:`rewind` once the step to
            continue from is known).
        csv: also write ``metrics.csv`` (one row per logged step, one column per metric ever logged).
        tensorboard: also write TensorBoard event files under ``<run_dir>/tensorboard``.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        backend: str = "wandb",
        project: str = "grpo_rl",
        config: dict | None = None,
        resume: bool = False,
        csv: bool = False,
        tensorboard: bool = False,
        run_name: str | None = None,
        tags: list[str] | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        mode = "a" if resume else "w"
        self._metrics = open(self.run_dir / "metrics.jsonl", mode, buffering=1)
        self._samples = open(self.run_dir / "samples.jsonl", mode, buffering=1)
        self._trained = open(self.run_dir / "trained.jsonl", mode, buffering=1)
        self._csv_fields: list[str] | None = [] if csv else None
        if csv:
            self._rewrite_csv()
        self._tensorboard = tensorboard
        self._tb = None
        self._tb_purge_step: int | None = None
        self._wandb = None
        if backend == "wandb":
            self._wandb = self._start_wandb(project, config, run_name=run_name, tags=tags)

    @classmethod
    def from_config(cls, cfg, run_dir: str | Path) -> RunLogger:
        """The logger the ``logger`` config group asks for (the config itself goes to wandb)."""
        from omegaconf import OmegaConf

        return cls(
            run_dir,
            backend=cfg.logger.backend,
            project=cfg.logger.project,
            config=OmegaConf.to_container(cfg, resolve=True),
            resume=bool(cfg.resume),
            csv=cfg.logger.csv,
            tensorboard=cfg.logger.tensorboard,
            run_name=cfg.logger.run_name,
            tags=None if cfg.logger.tags is None else list(cfg.logger.tags),
        )

    def _start_wandb(
        self, project: str, config: dict | None, *, run_name: str | None = None, tags: list[str] | None = None
    ):
        try:
            import wandb
        except ImportError:
            log.warning("logger.backend=wandb but wandb is not installed; logging to JSONL only")
            return None
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        try:
            return wandb.init(
                project=project,
                dir=str(self.run_dir),
                config=config,
                mode=mode,
                name=run_name or self.run_dir.name,
                tags=tags,
                reinit="finish_previous",
            )
        except Exception as e:  # a broken wandb must not take the run down
            log.warning("wandb could not start (%s); logging to JSONL only", e)
            return None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._metrics.write(json.dumps(record) + "\n")
        if self._csv_fields is not None:
            self._append_csv(record)
        if self._tensorboard:
            self._log_tensorboard(step, record)
        if self._wandb is not None:
            self._wandb.log(record, step=step)

    def rewind(self, step: int) -> None:
        """Forget everything logged after ``step`` (and lines that do not parse); wandb keeps what it has."""
        self._metrics.close()
        self._samples.close()
        self._trained.close()
        # A run killed after logging step k + 1 but before its checkpoint resumes from k: without this, k + 1 twice.
        for name in ("metrics.jsonl", "samples.jsonl", "reward_failures.jsonl", "trained.jsonl"):
            truncate_jsonl(self.run_dir / name, step)
        self._metrics = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        self._samples = open(self.run_dir / "samples.jsonl", "a", buffering=1)
        self._trained = open(self.run_dir / "trained.jsonl", "a", buffering=1)
        if self._csv_fields is not None:
            self._rewrite_csv()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        self._tb_purge_step = step + 1  # TensorBoard drops its events from this step on when it reopens

    def _append_csv(self, record: dict[str, Any]) -> None:
        if not set(record) <= set(self._csv_fields):
            self._rewrite_csv()  # a new column (an eval step, say): rewrite the file from metrics.jsonl
            return
        with open(self.run_dir / "metrics.csv", "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self._csv_fields, restval="").writerow(record)

    def _rewrite_csv(self) -> None:
        self._metrics.flush()
        records = read_jsonl(self.run_dir / "metrics.jsonl")
        fields: list[str] = []
        for record in records:
            fields.extend(k for k in record if k not in fields)
        self._csv_fields = fields
        tmp = self.run_dir / "metrics.csv.tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, restval="")
            if fields:
                writer.writeheader()
            writer.writerows(records)
        os.replace(tmp, self.run_dir / "metrics.csv")

    def _log_tensorboard(self, step: int, record: dict[str, Any]) -> None:
        if self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.warning("logger.tensorboard=true but tensorboard is not installed (pip install tensorboard)")
                self._tensorboard = False
                return
            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=self._tb_purge_step)
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._tb.add_scalar(key, value, step)

    def log_trained(self, step: int, batch: TensorDict) -> None:
        """Record in ``trained.jsonl`` what step ``step`` trained on (the run's provenance): when, the stream's batch
        and group indices and, per group, the prompt index and the policy version that generated it."""
        if batch is None:
            return
        keys = batch.keys()
        record: dict[str, Any] = {"step": step, "time": round(time.time(), 3)}
        for key in ("batch_index", "group_index"):
            if key in keys:
                record[key] = sorted(set(batch[key].tolist()))
        if "group_id" in keys and batch.batch_size[0]:
            groups, first = first_rows(batch["group_id"])
            record["group"] = [int(g) for g in groups]
            for key in ("prompt_index", "policy_version", "batch_index", "group_index"):
                if key in keys:
                    record[f"group_{key}"] = [int(v) for v in batch[key][first].tolist()]
        self._trained.write(json.dumps(record) + "\n")

    def log_samples(
        self, step: int, batch: TensorDict, num: int, reward_keys: list[str], detail: TokenDetail | None = None
    ) -> None:
        """Write the first answer of up to ``num`` groups spread over ``batch`` to ``samples.jsonl`` (one object
        each, :func:`~grpo_rl.run.sample_log.sample_record`; with ``detail``, plus its group's ``answers`` token by
        token), the console (one line each), wandb and TensorBoard."""
        group_id = batch["group_id"] if "group_id" in batch.keys() else None
        picked = examine_rows(group_id, batch.batch_size[0], num)
        rows = [sample_record(step, batch, i, reward_keys) for i in picked]
        for i, row in zip(picked, rows, strict=True):
            answers = {"answers": group_answers(batch, i, reward_keys, detail)} if detail is not None else {}
            self._samples.write(json.dumps({**row, **answers}, separators=(",", ":")) + "\n")
        if rows:
            groups = len(set(group_id.tolist())) if group_id is not None else batch.batch_size[0]
            log.info(
                "samples at step %d (first answer of %d of %d groups):\n%s",
                step,
                len(rows),
                groups,
                "\n".join("  " + sample_line(r) for r in rows),
            )
        if self._wandb is not None and rows:
            import wandb

            columns = list(rows[0].keys())
            data = [
                [
                    r.get(c) if isinstance(r.get(c), (str, int, float, bool, type(None))) else json.dumps(r.get(c))
                    for c in columns
                ]
                for r in rows
            ]
            self._wandb.log({"samples": wandb.Table(columns=columns, data=data)}, step=step)
        if self._tb is not None and rows:
            text = "\n\n".join(f"**reward {r['reward']:.3f}**\n\n{r['response']}" for r in rows)
            self._tb.add_text("samples", text, step)

    def close(self) -> None:
        self._metrics.close()
        self._samples.close()
        self._trained.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, skipping lines that do not parse (a write cut short by a kill)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def truncate_jsonl(path: str | Path, step: int) -> None:
    """Keep only the records of ``path`` whose ``step`` is at most ``step`` (rewritten atomically)."""
    path = Path(path)
    if not path.exists():
        return
    kept = [r for r in read_jsonl(path) if int(r.get("step", 0)) <= step]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, path)


def log_reward_failures(run_dir: str | Path, step: int, examples: list[dict]) -> int:
    """Append the samples on which a reward component failed (component, error, response) to
    ``<run_dir>/reward_failures.jsonl``, one JSON object each; returns how many were written."""
    if not examples:
        return 0
    with open(Path(run_dir) / "reward_failures.jsonl", "a") as f:
        for example in examples:
            f.write(json.dumps({"step": step, **example}, default=repr) + "\n")
    return len(examples)


def pipeline_suffix(metrics: dict[str, float]) -> str:
    """The asynchronous loop's addition to the console line: staleness, dropped samples and the learner's wait
    (empty for a step without them)."""
    if "staleness_mean" not in metrics:
        return ""
    return (
        f" | stale {metrics['staleness_mean']:.1f}/{metrics['staleness_max']}"
        f" | drop {metrics['dropped_samples']} | wait {metrics['learner_wait_seconds']:.1f}s"
    )


def console_line(step: int, total: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step}/{total}"]
    for key, fmt in CONSOLE_KEYS:
        if key in metrics:
            parts.append(fmt.format(metrics[key]))
    return " | ".join(parts)


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    return v
