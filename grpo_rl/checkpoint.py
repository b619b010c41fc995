"""Atomic training checkpoints, exact resume, and HF exports.

A checkpoint is a folder ``<run_dir>/checkpoints/step_XXXXXXXX/`` holding

* ``model/``: the policy as an HF folder (config, safetensors, tokenizer, chat template), loadable by
  transformers and vLLM as is. A LoRA run keeps its weights in ``adapter/`` instead (peft's format) and writes
  the merged ``model/`` only when asked (``train.export_checkpoints``);
* ``trainer_state.pt``: optimizer, LR scheduler, policy version, RNG states (python, numpy, torch), the
  environment's data position, the step, the run config, and anything else the loop hands in; loaded with
  ``weights_only=True``;
* ``config.yaml``: the run config, for people and for ``python -m grpo_rl.evaluation checkpoint=...``.

The engine needs no state of its own: its sampling seeds are derived from ``(seed, step)`` by the collector,
and its weights are pushed from the learner on resume.

The folder is written under a temporary name in the same directory, flushed to disk, and renamed into place:
a crash mid-write leaves a ``.tmp-*`` folder that is ignored (and cleaned up), never a checkpoint that
loads half. Re-saving an existing step moves the old folder aside first and deletes it only after the new
one is in place. Only the newest ``keep`` checkpoints are kept.
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


def _make_tmp(parent: Path, name: str) -> Path:
    """A fresh hidden folder in ``parent`` (same file system, so the final rename is atomic)."""
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".tmp-{name}-"))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would make checkpoints private to this user
    return tmp


def _publish(tmp: Path, final: Path) -> None:
    """Move the finished folder ``tmp`` to ``final``.

    An existing ``final`` is first renamed to ``.old-<name>-<pid>`` and deleted only once ``tmp`` is in place;
    if the second rename fails it is put back, and if the process dies between the two renames
    :func:`_recover_moved_aside` puts it back on the next look.
    """
    _fsync_tree(tmp)
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None and not final.exists():
            os.replace(old, final)
        raise
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _recover_moved_aside(root: Path) -> None:
    """Put back a folder that :func:`_publish` moved aside when the process died before its replacement landed."""
    for old in root.glob(".old-*"):
        name = old.name[len(".old-"):].rsplit("-", 1)[0]
        if not (root / name).exists():
            os.replace(old, root / name)
            log.warning("restored %s, moved aside by a save that did not finish", root / name)


class Checkpointer:
    """Saves and finds checkpoints of one run.

    Args:
        run_dir: the run's output folder; checkpoints live in ``run_dir/checkpoints``.
        keep: how many of the newest checkpoints to keep (0 keeps all).
    """

    def __init__(self, run_dir: str | Path, keep: int = 2):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, step: int, model: torch.nn.Module, tokenizer, state: dict[str, Any], *,
             export_model_dir: bool = True, config_yaml: str | None = None) -> Path:
        """Write checkpoint ``step`` atomically and prune old ones; returns its folder.

        Args:
            step: the number of completed training steps.
            model: the policy (a peft model for LoRA runs).
            tokenizer: saved beside the weights.
            state: trainer state (tensors, numbers, strings, containers of them).
            export_model_dir: for a LoRA model, also write the merged HF folder ``model/`` (full models always
                write it: it holds their weights).
            config_yaml: the run config as YAML, written to ``config.yaml``.
        """
        from grpo_rl.lora import ADAPTER_DIR, is_lora, save_adapter

        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step_{step:08d}"
        tmp = _make_tmp(self.root, final.name)
        try:
            if is_lora(model):
                save_adapter(model, tmp / ADAPTER_DIR)
            if export_model_dir or not is_lora(model):
                export_model(model, tokenizer, tmp / "model")
            if config_yaml is not None:
                (tmp / "config.yaml").write_text(config_yaml)
            # Written last: a folder with trainer_state.pt is complete (see list()).
            # A state that brings its own RNG states (taken at a step boundary) keeps them.
            torch.save({"rng": rng_state(), **state, "step": step}, tmp / "trainer_state.pt")
            _publish(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        log.info("checkpoint saved: %s", final)
        return final

    def _prune(self) -> None:
        _recover_moved_aside(self.root)
        for stale in list(self.root.glob(".tmp-*")) + list(self.root.glob(".old-*")):
            shutil.rmtree(stale, ignore_errors=True)
        if self.keep > 0:
            for old in self.list()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.exists():
            return []
        _recover_moved_aside(self.root)
        found = [p for p in self.root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)
                 and (p / "trainer_state.pt").exists()]
        return sorted(found, key=checkpoint_step)

    def latest(self) -> Path | None:
        ckpts = self.list()
        return ckpts[-1] if ckpts else None


def checkpoint_step(checkpoint: str | Path) -> int:
    """The step of a checkpoint folder, from its name (``step_00000012`` -> 12)."""
    match = _STEP_DIR.match(Path(checkpoint).name)
    if match is None:
        return int(load_trainer_state(checkpoint)["step"])
    return int(match.group(1))


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    path = Path(checkpoint) / "trainer_state.pt"
    if not path.exists():
        raise FileNotFoundError(f"{checkpoint} is not a checkpoint folder (no trainer_state.pt)")
    return torch.load(path, map_location="cpu", weights_only=True)


def load_model_weights(checkpoint: str | Path, model: torch.nn.Module) -> None:
    """Load a checkpoint's policy weights into ``model`` in place (adapters for a LoRA model, all weights otherwise)."""
    from grpo_rl.lora import ADAPTER_DIR, is_lora, load_adapter

    checkpoint = Path(checkpoint)
    if is_lora(model):
        if not (checkpoint / ADAPTER_DIR).exists():
            raise FileNotFoundError(f"{checkpoint}: no {ADAPTER_DIR}/ folder; was it written by a run with "
                                    "model.lora.enabled=false? Resume it with the same model.lora settings")
        load_adapter(model, checkpoint / ADAPTER_DIR)
        return
    if (checkpoint / ADAPTER_DIR).exists():
        raise ValueError(f"{checkpoint} holds LoRA adapters; resume it with model.lora.enabled=true")
    from transformers import AutoModelForCausalLM

    dtype = next(model.parameters()).dtype
    saved = AutoModelForCausalLM.from_pretrained(str(checkpoint / "model"), dtype=dtype)
    model.load_state_dict(saved.state_dict())


def export_model(model: torch.nn.Module, tokenizer, out_dir: str | Path) -> Path:
    """Write ``model`` and ``tokenizer`` as an HF folder (config, safetensors, tokenizer, chat template).

    A LoRA model is written merged (``W + (alpha / r) B A`` under the base names), without changing it.
    """
    from grpo_rl.lora import is_lora, save_merged_pretrained

    out_dir = Path(out_dir)
    if is_lora(model):
        save_merged_pretrained(model, out_dir)
    else:
        model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def export_model_atomic(model: torch.nn.Module, tokenizer, out_dir: str | Path) -> Path:
    """:func:`export_model` to a temporary sibling, then renamed into place (an old folder is replaced)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _recover_moved_aside(out_dir.parent)
    tmp = _make_tmp(out_dir.parent, out_dir.name)
    try:
        export_model(model, tokenizer, tmp)
        _publish(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
