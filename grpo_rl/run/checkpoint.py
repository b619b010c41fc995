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

The folder is written under a temporary name in the same directory, flushed to disk, and renamed into place:
a crash mid-write leaves a ``.tmp-*`` folder that is ignored (and removed by the next :class:`Checkpointer`
of the run, see :func:`remove_stale_tmp`), never a checkpoint that loads half. A full disk raises
:class:`DiskFullError` and leaves the previous checkpoint as it was. Re-saving an existing step moves the old
folder aside first and deletes it only after the new one is in place. Only the newest ``keep`` checkpoints are
kept.

Nothing is loaded from a checkpoint before it is checked against its manifest (:func:`verify_checkpoint`, called by
:func:`load_trainer_state` and :func:`load_model_weights`): a file cut short or changed after the save is a
:class:`CheckpointDamagedError` naming the file, and :meth:`Checkpointer.latest_intact` passes over damaged
checkpoints to the newest intact one. A checkpoint written before manifests existed gets the checks that need no
manifest (its JSON files and safetensors headers), and a load that fails on it names the file too.
"""
from __future__ import annotations

import errno
import logging
import os
import pickle
import random
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_rl.errors import RunFolderError, UserError
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
# ``.tmp-<name>-<pid>@<host>-<random>``: the writer of a temporary folder, so that a look at the run folder
# from another process (an evaluation of a live run) never removes a save that is still being written.
_TMP_WRITER = re.compile(r"^\.tmp-.*-(\d+)@([^-]*)-[^-]*$")
# A temporary folder of another host is left alone unless it is older than this (no save takes a day).
_FOREIGN_TMP_MAX_AGE_S = 24 * 3600
_DISK_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# How safetensors and other libraries that hide the errno spell it.
_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded", "storagefull", "quotaexceeded")
# A write that fails with less than this free is taken as a full disk.
_NEARLY_FULL_BYTES = 64 * 2**20


class DiskFullError(UserError, OSError):
    """A checkpoint or export could not be written because the disk (or the user's quota) is full."""


class CheckpointNotFoundError(RunFolderError, FileNotFoundError):
    """A folder is not a checkpoint, or lacks what the model being resumed needs."""


class CheckpointMismatchError(RunFolderError, ValueError):
    """A checkpoint's weights do not fit the model they are loaded into."""


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


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())  # no "-": it separates the parts of a tmp name


def _make_tmp(parent: Path, name: str) -> Path:
    """A fresh hidden folder in ``parent`` (same file system, so the final rename is atomic), named after its
    writer (pid and host) so that :func:`remove_stale_tmp` can tell a live save from debris."""
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".tmp-{name}-{os.getpid()}@{_host()}-"))
    os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp's 0700 would make checkpoints private to this user
    return tmp


def _process_umask() -> int:
    """This process's umask, read without changing it (the ``Umask:`` line of ``/proc/self/status``, Linux 4.7+).
    Without that line it is set and put back, once, at import; to 0o077 meanwhile, so that a file another thread
    creates in that instant is only more private, never writable by others as under ``umask(0)``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


_UMASK = _process_umask()  # once: the umask is process-wide, and the run's threads create files


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    except OSError:
        return False
    return True


def _is_stale_tmp(folder: Path) -> bool:
    """Whether a ``.tmp-*`` folder is debris: its writer is this process (whose saves are over), a dead process
    of this host, unknown (an older naming), or another host's and more than a day old."""
    match = _TMP_WRITER.match(folder.name)
    if match is None:
        return True
    pid, host = int(match.group(1)), match.group(2)
    if host == _host():
        return pid == os.getpid() or not _pid_alive(pid)
    try:
        return time.time() - folder.stat().st_mtime > _FOREIGN_TMP_MAX_AGE_S
    except OSError:
        return False


def remove_stale_tmp(root: str | Path) -> int:
    """Remove the temporary folders (``.tmp-*``) that interrupted saves left in ``root``; returns how many.

    A folder whose writer is another live process (a run saving while this one only looks) is kept.
    """
    root = Path(root)
    if not root.is_dir():
        return 0
    removed = 0
    for tmp in root.glob(".tmp-*"):
        if tmp.is_dir() and _is_stale_tmp(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            removed += not tmp.exists()
    return removed


def _errors_of(error: BaseException):
    """``error`` and the exceptions it was raised from or while handling."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


def _disk_full_error(error: BaseException, what: str, target: Path, free: int | None,
                     kept: str) -> DiskFullError | None:
    """A :class:`DiskFullError` for ``error`` if a full disk caused it, else None.

    Args:
        error: what the write raised.
        what: the thing that was being written, for the message ("checkpoint /run/checkpoints/step_00000010").
        target: a path on the disk written to.
        free: free bytes on that disk when the write failed (before its partial output was removed).
        kept: what is still intact, for the message ("earlier checkpoints are intact").
    """
    code = None
    for e in _errors_of(error):
        if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
            code = e.errno
            break
        text = str(e).lower()
        if any(t in text for t in _DISK_FULL_TEXT):
            code = errno.EDQUOT if "quota" in text and hasattr(errno, "EDQUOT") else errno.ENOSPC
            break
    if code is None:
        # torch.save says only "file write failed": a failed write on a nearly full disk is taken as full.
        if ("write" not in str(error).lower() or not isinstance(error, (OSError, RuntimeError))
                or free is None or free >= _NEARLY_FULL_BYTES):
            return None
        code = errno.ENOSPC
    if code == errno.ENOSPC:
        cause = f"the disk is full ({os.strerror(code)}, ENOSPC"
    else:
        cause = f"your disk quota is used up ({os.strerror(code)}, EDQUOT"
    now = _free_bytes(target)
    cause += f"; {now / 2**20:.0f} MiB free now)" if now is not None else ")"
    full = DiskFullError(f"cannot write {what}: {cause}. Free space on that disk, or set output_dir to a folder on "
                         f"another disk (train.keep_checkpoints=1 keeps fewer checkpoints). The partial folder was "
                         f"removed; {kept}")
    full.errno = code
    return full


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
        removed = remove_stale_tmp(self.root)
        if removed:
            log.info("removed %d unfinished checkpoint folder(s) (.tmp-*) left in %s by an interrupted save",
                     removed, self.root)

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

        Raises:
            DiskFullError: the disk or quota is full; nothing of this save is left behind.
        """
        from grpo_rl.model.lora import ADAPTER_DIR, is_lora, save_adapter

        final = self.root / f"step_{step:08d}"
        tmp = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = _make_tmp(self.root, final.name)
            if is_lora(model):
                save_adapter(model, tmp / ADAPTER_DIR)
            if export_model_dir or not is_lora(model):
                export_model(model, tokenizer, tmp / "model")
            if config_yaml is not None:
                (tmp / "config.yaml").write_text(config_yaml)
            # A state that brings its own RNG states (taken at a step boundary) keeps them.
            torch.save({"rng": rng_state(), **state, "step": step}, tmp / "trainer_state.pt")
            write_manifest(tmp)  # last: it records every file above
            _publish(tmp, final)
        except BaseException as e:
            free = _free_bytes(self.root)  # before the partial folder is removed, which frees space again
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            full = (_disk_full_error(e, f"checkpoint {final}", self.root, free, "earlier checkpoints are intact")
                    if isinstance(e, Exception) else None)
            if full is not None:
                raise full from e
            raise
        self._prune(step)
        log.info("checkpoint saved: %s", final)
        return final

    def _prune(self, saved_step: int) -> None:
        """Remove debris, the checkpoints past ``keep``, and those newer than ``saved_step``.

        A checkpoint newer than the one just saved belongs to the history this run replaced: it resumed from an
        earlier checkpoint (an explicit ``resume``, or ``resume=auto`` passing over a damaged newer one) and cut the
        logs back to that step. Kept, it would make ``keep`` prune this run's own checkpoints first, and a later
        ``resume=auto`` continue the old history.
        """
        _recover_moved_aside(self.root)
        remove_stale_tmp(self.root)
        for stale in self.root.glob(".old-*"):
            shutil.rmtree(stale, ignore_errors=True)
        for newer in [c for c in self.list() if checkpoint_step(c) > saved_step]:
            log.warning("removed %s, a checkpoint of the history this run replaced (it resumed from an earlier one "
                        "and has now saved step %d)", newer, saved_step)
            shutil.rmtree(newer, ignore_errors=True)
        if self.keep > 0:
            for old in self.list()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)

    def list(self) -> list[Path]:
        """Complete checkpoints (published step folders with a trainer state), oldest first; not checked for
        damage (see :meth:`latest_intact`)."""
        if not self.root.exists():
            return []
        _recover_moved_aside(self.root)
        found = [p for p in self.root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)
                 and (p / "trainer_state.pt").exists()]
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
        which = (f"the only checkpoint in {self.root} is damaged" if len(checkpoints) == 1 else
                 f"all {len(checkpoints)} checkpoints in {self.root} are damaged; the newest")
        raise CheckpointDamagedError(
            f"{which}: {damaged[0][1]}. Restore the checkpoints from a copy, or start a new run in another output_dir")


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
    log.warning("checkpoint %s is damaged (%s); using %s, the newest intact one, instead", checkpoint, damage,
                instead.name)


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """The trainer state of a checkpoint (``trainer_state.pt``, loaded with ``weights_only=True``), after
    :func:`verify_checkpoint`.

    Raises:
        CheckpointNotFoundError: the folder has no ``trainer_state.pt``.
        CheckpointDamagedError: a file of the checkpoint is damaged, or the state does not load.
    """
    path = Path(checkpoint) / "trainer_state.pt"
    if not path.exists():
        raise CheckpointNotFoundError(f"{checkpoint} is not a checkpoint folder (no trainer_state.pt); pass a "
                                      "<run dir>/checkpoints/step_NNNNNNNN folder")
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
            return (f"{key} has shape {list(saved[key].shape)} in the checkpoint and {list(tensor.shape)} "
                    "in this model")
    return None


def _mismatch_error(checkpoint: Path, model: torch.nn.Module, reason: str) -> CheckpointMismatchError:
    saved = saved_model_name(checkpoint)
    current = getattr(getattr(model, "config", None), "_name_or_path", None) or "this run's model"
    trained = f"with model.name={saved}" if saved else "with another model"
    same = f"model.name={saved}" if saved else "the model.name it was trained with"
    return CheckpointMismatchError(
        f"{checkpoint} was trained {trained}, not {current}: its weights do not fit ({reason}). Resume it with "
        f"{same}, or set output_dir to another folder to start a fresh run")


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
                "Resume it with the same model.lora settings")
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
        raise CheckpointNotFoundError(f"{checkpoint}: no model/ folder with the policy's weights; pass a checkpoint "
                                      "folder written by grpo_rl (<run dir>/checkpoints/step_NNNNNNNN)")
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
    """Write ``model`` and ``tokenizer`` as an HF folder (config, safetensors, tokenizer, chat template).

    A LoRA model is written merged (``W + (alpha / r) B A`` under the base names), without changing it.
    """
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
    tmp = None
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        _recover_moved_aside(out_dir.parent)
        tmp = _make_tmp(out_dir.parent, out_dir.name)
        export_model(model, tokenizer, tmp)
        _publish(tmp, out_dir)
    except BaseException as e:
        free = _free_bytes(out_dir.parent)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        full = (_disk_full_error(e, f"the model export {out_dir}", out_dir.parent, free,
                                 f"an earlier {out_dir.name} is intact") if isinstance(e, Exception) else None)
        if full is not None:
            raise full from e
        raise
    return out_dir
