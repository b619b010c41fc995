"""Atomic training checkpoints and resume.

A checkpoint is a folder ``<run_dir>/checkpoints/step_XXXXXXXX/`` holding

* ``model/``: the policy as an HF folder (config, safetensors, tokenizer, chat template), loadable by
  transformers and vLLM as is;
* ``trainer_state.pt``: optimizer, LR scheduler, policy version, RNG states (python, numpy, torch), the
  environment's data position, the step, and anything else the loop hands in; loaded with
  ``weights_only=True``.

The folder is written under a temporary name in the same directory, flushed to disk, and renamed into place:
a crash mid-write leaves a ``.tmp-*`` folder that is ignored (and cleaned up), never a checkpoint that
loads half. Only the newest ``keep`` checkpoints are kept.
"""
from __future__ import annotations

import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{8})$")


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                  "has_gauss": has_gauss, "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuplify(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    """Saves and finds checkpoints of one run.

    Args:
        run_dir: the run's output folder; checkpoints live in ``run_dir/checkpoints``.
        keep: how many of the newest checkpoints to keep (0 keeps all).
    """

    def __init__(self, run_dir: str | Path, keep: int = 2):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, step: int, model: torch.nn.Module, tokenizer, state: dict[str, Any]) -> Path:
        """Write checkpoint ``step`` atomically and prune old ones; returns its folder."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step_{step:08d}"
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".tmp-step_{step:08d}-"))
        try:
            export_model(model, tokenizer, tmp / "model")
            torch.save({**state, "step": step, "rng": rng_state()}, tmp / "trainer_state.pt")
            _fsync_tree(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        log.info("checkpoint saved: %s", final)
        return final

    def _prune(self) -> None:
        for stale in self.root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if self.keep > 0:
            for old in self.list()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.exists():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)
                 and (p / "trainer_state.pt").exists()]
        return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))

    def latest(self) -> Path | None:
        ckpts = self.list()
        return ckpts[-1] if ckpts else None


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    path = Path(checkpoint) / "trainer_state.pt"
    if not path.exists():
        raise FileNotFoundError(f"{checkpoint} is not a checkpoint folder (no trainer_state.pt)")
    return torch.load(path, map_location="cpu", weights_only=True)


def export_model(model: torch.nn.Module, tokenizer, out_dir: str | Path) -> Path:
    """Write ``model`` and ``tokenizer`` as an HF folder (config, safetensors, tokenizer, chat template)."""
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
