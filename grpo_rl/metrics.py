"""Run logging: a JSONL file always, wandb when asked (offline unless a key is set), and a console line.

Every step writes one JSON object to ``<run_dir>/metrics.jsonl``; sample tables go to
``<run_dir>/samples.jsonl``. wandb is imported lazily, runs in offline mode when no ``WANDB_API_KEY`` is set
(``WANDB_MODE`` still wins if the user set it), and writes under ``<run_dir>/wandb``.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

log = logging.getLogger(__name__)

CONSOLE_KEYS = (
    ("reward_mean", "reward {:.3f}"),
    ("reward_correct_mean", "acc {:.3f}"),
    ("reward_format_mean", "fmt {:.3f}"),
    ("kl_ref", "kl {:.4f}"),
    ("clip_fraction", "clip {:.3f}"),
    ("response_length_mean", "len {:.0f}"),
    ("grad_norm", "gnorm {:.3f}"),
    ("tokens_per_second", "tok/s {:.0f}"),
    ("step_seconds", "{:.1f}s"),
)


class RunLogger:
    """Writes metrics and samples for one run.

    Args:
        run_dir: the run's output folder.
        backend: ``"wandb"`` or ``"none"`` (JSONL is always written).
        project: wandb project.
        config: the resolved config, stored with the wandb run.
        resume: append to existing files instead of starting new ones.
    """

    def __init__(self, run_dir: str | Path, *, backend: str = "wandb", project: str = "grpo_rl",
                 config: dict | None = None, resume: bool = False):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        mode = "a" if resume else "w"
        self._metrics = open(self.run_dir / "metrics.jsonl", mode, buffering=1)
        self._samples = open(self.run_dir / "samples.jsonl", mode, buffering=1)
        self._wandb = None
        if backend == "wandb":
            self._wandb = self._start_wandb(project, config)

    def _start_wandb(self, project: str, config: dict | None):
        try:
            import wandb
        except ImportError:
            log.warning("logger.backend=wandb but wandb is not installed; logging to JSONL only")
            return None
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        try:
            return wandb.init(project=project, dir=str(self.run_dir), config=config, mode=mode,
                              name=self.run_dir.name, reinit="finish_previous")
        except Exception as e:  # a broken wandb must not take the run down
            log.warning("wandb could not start (%s); logging to JSONL only", e)
            return None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._metrics.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log(record, step=step)

    def log_samples(self, step: int, batch: TensorDict, num: int, reward_keys: list[str]) -> None:
        rows = []
        for i in range(min(num, batch.batch_size[0])):
            row = {"step": step, "prompt": batch["prompt"][i], "response": batch["response_text"][i],
                   "reward": float(batch["reward"][i])}
            row.update({k: float(batch[k][i]) for k in reward_keys})
            rows.append(row)
            self._samples.write(json.dumps(row) + "\n")
        if self._wandb is not None and rows:
            import wandb

            columns = list(rows[0].keys())
            self._wandb.log({"samples": wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])},
                            step=step)

    def close(self) -> None:
        self._metrics.close()
        self._samples.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def console_line(step: int, total: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step}/{total}"]
    for key, fmt in CONSOLE_KEYS:
        if key in metrics:
            parts.append(fmt.format(metrics[key]))
    return " | ".join(parts)


def batch_metrics(batch: TensorDict) -> dict[str, float]:
    """Reward, component and length statistics of a collected batch."""
    out: dict[str, float] = {}
    reward = batch["reward"]
    out["reward_mean"] = float(reward.mean())
    out["reward_std"] = float(reward.std()) if reward.numel() > 1 else 0.0
    for key in batch.keys():
        if isinstance(key, str) and key.startswith("reward_"):
            out[f"{key}_mean"] = float(batch[key].float().mean())
    lengths = batch["response_mask"].sum(-1).float()
    out["response_length_mean"] = float(lengths.mean())
    out["response_length_max"] = float(lengths.max())
    out["truncated_fraction"] = float(batch["truncated"].float().mean())
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    return v
