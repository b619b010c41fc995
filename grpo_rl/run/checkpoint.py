"""Atomic training checkpoints, exact resume, and HF exports.

A checkpoint is a folder ``<run_dir>/checkpoints/step_XXXXXXXX/`` holding

* ``model/``: the policy as an HF folder (config, safetensors, tokenizer, chat template), loadable by
  transformers and vLLM as is. A LoRA run keeps its weights in ``adapter/`` instead (peft's format) and writes
  the merged ``model/`` only when asked (``train.export_checkpoints``);
* ``trainer_state.pt``: optimizer, LR scheduler, policy version, RNG states (python, numpy, torch), the
  environment's data position, the step, the run config, and anything else the loop hands in; loaded with
  ``weights_only=True``;
* ``config.yaml``: the run config, for people and for ``python -m grpo_rl.cli.evaluate checkpoint=...``;
* ``manifest.json``, written last: every other file's size and SHA-256 (:mod:`grpo_rl.run.manifest`).

The engine needs no state of its own: its sampling seeds are derived from ``(seed, step)`` by the collector,
and its weights are pushed from the learner on resume.

A checkpoint is written whole or not at all (:func:`grpo_rl.run.atomic_fs.atomic_folder`): a crash mid-write
leaves a ``.tmp-*`` folder that is ignored (and removed by the next :class:`Checkpointer` of the run), never a
checkpoint that loads half; a full disk raises :class:`~grpo_rl.run.atomic_fs.DiskFullError` and leaves the previous
checkpoint as it was; re-saving an existing step replaces the old folder only once the new one is in place. Only the
newest ``keep`` checkpoints are kept.

Nothing is loaded from a checkpoint before it is checked against its manifest (:func:`verify_checkpoint`, called by
:func:`load_trainer_state` and :func:`load_model_weights`): a file cut short or changed after the save is a
:class:`CheckpointDamagedError` naming the file, and :meth:`Checkpointer.latest_intact` passes over damaged
checkpoints to the newest intact one. A checkpoint written before manifests existed gets the checks that need no
manifest (its JSON files and safetensors headers), and a load that fails on it names the file too.
"""

from __future__ import annotations

import logging
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_rl.errors import RunFolderError
from grpo_rl.run.atomic_fs import (
    DiskFullError,  # noqa: F401 - what the saves and exports below raise
    atomic_folder,
    recover_moved_aside,
    remove_stale_tmp,
)
from grpo_rl.run.manifest import (
    CheckpointDamagedError,
    Damage,
    checkpoint_damage,
    damaged,
    damaged_file_error,
    load_error,
    torch_file_problem,
    verify_checkpoint,
    write_manifest,
)

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointNotFoundError(RunFolderError, FileNotFoundError):
    """A folder is not a checkpoint, or lacks what the model being resumed needs."""


class CheckpointMismatchError(RunFolderError, ValueError):
    """A checkpoint's weights do not fit the model they are loaded into."""


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
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


class Checkpointer:
    """Saves and finds the checkpoints of one run, in ``run_dir/checkpoints``, keeping the newest ``keep`` (0:
    all)."""

    def __init__(self, run_dir: str | Path, keep: int = 2):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep
        removed = remove_stale_tmp(self.root)
        if removed:
            log.info(
                "removed %d unfinished checkpoint folder(s) (.tmp-*) left in %s by an interrupted save",
                removed,
                self.root,
            )

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        tokenizer,
        state: dict[str, Any],
        *,
        export_model_dir: bool = True,
        config_yaml: str | None = None,
    ) -> Path:
        """Write checkpoint ``step`` (completed training steps) atomically and prune old ones; returns its folder.

        Args:
            state: trainer state (tensors, numbers, strings, containers of them).
            export_model_dir: for a LoRA model, also write the merged HF folder ``model/`` (full models always
                write it: it holds their weights).
            config_yaml: the run config as YAML, written to ``config.yaml``.

        Raises:
            DiskFullError: the disk or quota is full; nothing of this save is left behind.
        """
        from grpo_rl.model.lora import ADAPTER_DIR, is_lora, save_adapter

        final = self.root / f"step_{step:08d}"
        with atomic_folder(final, f"checkpoint {final}", kept="earlier checkpoints are intact") as tmp:
            if is_lora(model):
                save_adapter(model, tmp / ADAPTER_DIR)
            if export_model_dir or not is_lora(model):
                export_model(model, tokenizer, tmp / "model")
            if config_yaml is not None:
                (tmp / "config.yaml").write_text(config_yaml)
            # A state that brings its own RNG states (taken at a step boundary) keeps them.
            torch.save({"rng": rng_state(), **state, "step": step}, tmp / "trainer_state.pt")
            write_manifest(tmp)  # last: it records every file above
        self._prune(step)
        log.info("checkpoint saved: %s", final)
        return final

    def _prune(self, saved_step: int) -> None:
        """Remove debris, the checkpoints past ``keep``, and those newer than ``saved_step``."""
        recover_moved_aside(self.root)
        remove_stale_tmp(self.root)
        for stale in self.root.glob(".old-*"):
            shutil.rmtree(stale, ignore_errors=True)
        # A newer checkpoint belongs to the history this run replaced (it resumed from an earlier one and cut the
        # logs back); kept, it would make keep prune this run's own checkpoints first, and resume=auto continue it.
        for newer in [c for c in self.list() if checkpoint_step(c) > saved_step]:
            log.warning(
                "removed %s, a checkpoint of the history this run replaced (it resumed from an earlier one "
                "and has now saved step %d)",
                newer,
                saved_step,
            )
            shutil.rmtree(newer, ignore_errors=True)
        if self.keep > 0:
            for old in self.list()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)

    def list(self) -> list[Path]:
        """Complete checkpoints (published step folders with a trainer state), oldest first; not checked for
        damage (see :meth:`latest_intact`)."""
        if not self.root.exists():
            return []
        recover_moved_aside(self.root)
        found = [
            p
            for p in self.root.iterdir()
            if p.is_dir() and _STEP_DIR.match(p.name) and (p / "trainer_state.pt").exists()
        ]
        return sorted(found, key=checkpoint_step)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, not checked for damage; None if there is none."""
        ckpts = self.list()
        return ckpts[-1] if ckpts else None

    def latest_intact(self) -> Path | None:
        """The newest checkpoint that passes :func:`checkpoint_damage`, with one warning for each newer damaged one
        (naming its file and what is wrong); None if there is none.

        Raises:
            CheckpointDamagedError: every checkpoint is damaged (the message names the newest one's file).
        """
        checkpoints = self.list()
        damaged: list[tuple[Path, Damage]] = []
        for checkpoint in reversed(checkpoints):
            damage = checkpoint_damage(checkpoint)
            if damage is None:
                for newer, its_damage in damaged:
                    _warn_damaged(newer, its_damage, instead=checkpoint)
                return checkpoint
            damaged.append((checkpoint, damage))
        if not damaged:
            return None
        which = (
            f"the only checkpoint in {self.root} is damaged"
            if len(checkpoints) == 1
            else f"all {len(checkpoints)} checkpoints in {self.root} are damaged; the newest"
        )
        raise CheckpointDamagedError(
            f"{which}: {damaged[0][1]}. Restore the checkpoints from a copy, or start a new run in another output_dir"
        )


def checkpoint_step(checkpoint: str | Path) -> int:
    """The step of a checkpoint folder, from its name (``step_00000012`` -> 12)."""
    match = _STEP_DIR.match(Path(checkpoint).name)
    if match is None:
        return int(load_trainer_state(checkpoint)["step"])
    return int(match.group(1))


# Damaged checkpoints already warned about in this process: a resume looks for its checkpoint twice (the run folder
# check at start, then the load), and says once what it passed over.
_WARNED: set[tuple[str, str]] = set()


def _warn_damaged(checkpoint: Path, damage: Damage, instead: Path) -> None:
    if (str(checkpoint), str(damage)) in _WARNED:
        return
    _WARNED.add((str(checkpoint), str(damage)))
    log.warning(
        "checkpoint %s is damaged (%s); using %s, the newest intact one, instead", checkpoint, damage, instead.name
    )


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """The trainer state of a checkpoint (``trainer_state.pt``, loaded with ``weights_only=True``), after
    :func:`verify_checkpoint`.

    Raises:
        CheckpointNotFoundError: the folder has no ``trainer_state.pt``.
        CheckpointDamagedError: a file of the checkpoint is damaged, or the state does not load.
    """
    path = Path(checkpoint) / "trainer_state.pt"
    if not path.exists():
        raise CheckpointNotFoundError(
            f"{checkpoint} is not a checkpoint folder (no trainer_state.pt); pass a "
            "<run dir>/checkpoints/step_NNNNNNNN folder"
        )
    verify_checkpoint(checkpoint)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:
        problem = torch_file_problem(path, read_all=True)
        if problem is not None:
            raise damaged(path, problem) from e
        if isinstance(e, pickle.UnpicklingError) and "weights only" in str(e).lower():
            raise  # a whole file holding a type the state should not: a bug, not damage
        raise load_error(path, e) from e


def saved_model_name(checkpoint: str | Path) -> str | None:
    """``model.name`` of the run that wrote ``checkpoint`` (from its ``config.yaml``), or None if unknown."""
    import yaml

    try:
        config = yaml.safe_load((Path(checkpoint) / "config.yaml").read_text(encoding="utf-8"))
        name = config["model"]["name"]
    except Exception:  # noqa: BLE001 - no file, not YAML, no such key: all mean "unknown"
        return None
    return name if isinstance(name, str) else None


def _weights_mismatch(saved: dict[str, torch.Tensor], current: dict[str, torch.Tensor]) -> str | None:
    """What keeps ``saved`` from loading into a model with the weights ``current``, in a few words, or None."""
    missing = [k for k in current if k not in saved]
    unexpected = [k for k in saved if k not in current]
    if missing or unexpected:
        parts = [f"{len(missing)} weight(s) of this model missing from it (e.g. {missing[0]})"] if missing else []
        parts += [f"{len(unexpected)} weight(s) this model lacks (e.g. {unexpected[0]})"] if unexpected else []
        return " and ".join(parts)
    for key, tensor in current.items():
        if saved[key].shape != tensor.shape:
            return f"{key} has shape {list(saved[key].shape)} in the checkpoint and {list(tensor.shape)} in this model"
    return None


def _mismatch_error(checkpoint: Path, model: torch.nn.Module, reason: str) -> CheckpointMismatchError:
    saved = saved_model_name(checkpoint)
    current = getattr(getattr(model, "config", None), "_name_or_path", None) or "this run's model"
    trained = f"with model.name={saved}" if saved else "with another model"
    same = f"model.name={saved}" if saved else "the model.name it was trained with"
    return CheckpointMismatchError(
        f"{checkpoint} was trained {trained}, not {current}: its weights do not fit ({reason}). Resume it with "
        f"{same}, or set output_dir to another folder to start a fresh run"
    )


def load_model_weights(checkpoint: str | Path, model: torch.nn.Module) -> None:
    """Load a checkpoint's policy weights into ``model`` in place (adapters for a LoRA model, all weights otherwise).

    Raises:
        CheckpointMismatchError: the checkpoint was written for another model (other architecture or sizes),
            or holds LoRA adapters and ``model`` has none.
        CheckpointNotFoundError: ``model`` has LoRA adapters and the checkpoint none, or it has no weights.
        CheckpointDamagedError: a file of the checkpoint is damaged (:func:`verify_checkpoint`), or its weights do
            not load.
    """
    from grpo_rl.model.lora import ADAPTER_DIR, is_lora, load_adapter

    checkpoint = Path(checkpoint)
    verify_checkpoint(checkpoint)
    if is_lora(model):
        if not (checkpoint / ADAPTER_DIR).exists():
            raise CheckpointNotFoundError(
                f"{checkpoint}: no {ADAPTER_DIR}/ folder; was it written by a run with model.lora.enabled=false? "
                "Resume it with the same model.lora settings"
            )
        try:
            load_adapter(model, checkpoint / ADAPTER_DIR)
        except RuntimeError as e:  # unexpected keys or size mismatches: adapters of another model or rank
            reason = str(e).strip().splitlines()[0][:300]
            raise _mismatch_error(checkpoint, model, f"{reason}; or other model.lora settings") from e
        except Exception as e:  # noqa: BLE001 - a damaged file is reported, anything else re-raised
            damaged = damaged_file_error(checkpoint / ADAPTER_DIR, e)
            if damaged is None:
                raise
            raise damaged from e
        return
    if (checkpoint / ADAPTER_DIR).exists():
        raise CheckpointMismatchError(f"{checkpoint} holds LoRA adapters; resume it with model.lora.enabled=true")
    if not (checkpoint / "model" / "config.json").exists():
        raise CheckpointNotFoundError(
            f"{checkpoint}: no model/ folder with the policy's weights; pass a checkpoint "
            "folder written by grpo_rl (<run dir>/checkpoints/step_NNNNNNNN)"
        )
    from transformers import AutoModelForCausalLM

    dtype = next(model.parameters()).dtype
    try:
        saved = AutoModelForCausalLM.from_pretrained(str(checkpoint / "model"), dtype=dtype).state_dict()
    except Exception as e:  # noqa: BLE001 - safetensors, json and transformers each raise their own type
        damaged = damaged_file_error(checkpoint / "model", e)
        if damaged is None:
            raise
        raise damaged from e
    reason = _weights_mismatch(saved, model.state_dict())
    if reason is not None:
        raise _mismatch_error(checkpoint, model, reason)
    try:
        model.load_state_dict(saved)
    except RuntimeError as e:  # what the check above does not foresee
        raise _mismatch_error(checkpoint, model, str(e).strip().splitlines()[0][:300]) from e


def export_model(model: torch.nn.Module, tokenizer, out_dir: str | Path) -> Path:
    """Write ``model`` and ``tokenizer`` as an HF folder; a LoRA model is written merged, without changing it."""
    from grpo_rl.model.lora import is_lora, save_merged_pretrained

    out_dir = Path(out_dir)
    if is_lora(model):
        save_merged_pretrained(model, out_dir)
    else:
        model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def export_model_atomic(model: torch.nn.Module, tokenizer, out_dir: str | Path) -> Path:
    """:func:`export_model` to a temporary sibling, then renamed into place (an old folder is replaced).

    Raises:
        DiskFullError: the disk or quota is full; the old folder is kept and nothing of this export is left.
    """
    out_dir = Path(out_dir)
    with atomic_folder(out_dir, f"the model export {out_dir}", kept=f"an earlier {out_dir.name} is intact") as tmp:
        recover_moved_aside(out_dir.parent)  # an export killed between its two renames left the old folder aside
        export_model(model, tokenizer, tmp)
    return out_dir
