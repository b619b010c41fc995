"""The run folder before a run starts: whether it may hold this run, which checkpoint a resume takes, and which
settings changed since that checkpoint.

A fresh run refuses a folder that holds another run (:func:`check_run_folder`); ``resume=auto`` takes the newest
intact checkpoint and ``resume=<folder>`` that one or none (:func:`find_resume_checkpoint`); a resumed run warns
about every setting that changed and matters (:func:`config_changes`). Resuming itself, the checkpoints of the
run, stopping and the step logs are :mod:`grpo_rl.run.checkpoint_manager`'s, :mod:`grpo_rl.run.stopping`'s and
:mod:`grpo_rl.run.step_log`'s.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from grpo_rl.errors import RunFolderError
from grpo_rl.run.checkpoint import CheckpointDamagedError, Checkpointer, saved_model_name, verify_checkpoint

# Keys that may change between a run and its resumption without changing what is computed.
_RESUMABLE_CHANGES = (
    "resume",
    "output_dir",
    "train.steps",
    "train.prompt_epochs",
    "train.max_time_minutes",
    "train.checkpoint_frequency",
    "train.keep_checkpoints",
    "train.export_checkpoints",
    "logger.",
    "eval.",
    "model.cache_dir",
)


def find_resume_checkpoint(cfg, checkpointer: Checkpointer) -> Path | None:
    """The checkpoint ``cfg.resume`` names (``auto``: the newest intact one, warning about each newer damaged one),
    verified before anything of it is loaded; None without ``resume`` or when ``auto`` finds no checkpoint yet.

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
            f"<run dir>/checkpoints/step_NNNNNNNN folder, or resume=auto output_dir=<run dir> for the newest one"
        )
    try:
        verify_checkpoint(path)
    except CheckpointDamagedError as e:
        raise CheckpointDamagedError(f"resume={cfg.resume}: {e}") from None
    return path


def check_output_dir(run_dir: Path) -> None:
    """Raise :class:`RunFolderError` if the run folder cannot be made because it, or a folder above it, is a
    file; the entry scripts call it first, before Hydra makes the folder, and :func:`check_run_folder` again."""
    run_dir = Path(run_dir).expanduser()
    for path in (run_dir, *run_dir.parents):
        if path.exists() or path.is_symlink():
            if path.is_dir():
                return
            kind = "a file" if path.is_file() else "not a folder"
            where = f"is {kind}" if path == run_dir else f"is inside {path}, which is {kind}"
            raise RunFolderError(
                f"output_dir={run_dir} {where}, so the run cannot write there; set output_dir to a folder (it is "
                "made if it does not exist), or move that file away"
            )


def check_run_folder(cfg, run_dir: Path) -> None:
    """Refuse a run folder that would mix two runs or cannot be one, before anything starts: a file in its path,
    a fresh run over another run's logs, a damaged checkpoint to resume, or one of another model."""
    check_output_dir(run_dir)
    checkpointer_root = run_dir / "checkpoints"
    checkpoints = sorted(checkpointer_root.glob("step_*")) if checkpointer_root.is_dir() else []
    metrics = run_dir / "metrics.jsonl"
    if not cfg.resume:
        # it would overwrite the other run's logs, and a later resume=auto would continue the other run
        if checkpoints or (metrics.is_file() and metrics.stat().st_size > 0):
            held = f"checkpoints up to {checkpoints[-1].name}" if checkpoints else "the metrics of an earlier run"
            raise RunFolderError(
                f"output_dir={run_dir} already holds {held}. To continue that run pass resume=auto; to start a "
                f"new one choose another output_dir (or leave it unset for a fresh outputs/DATE/TIME folder)"
            )
        return
    checkpoint = find_resume_checkpoint(cfg, Checkpointer(run_dir, keep=cfg.train.keep_checkpoints))
    if checkpoint is None:
        return
    saved = saved_model_name(checkpoint)
    if saved is not None and saved != cfg.model.name:
        raise RunFolderError(
            f"resume={cfg.resume}: {checkpoint} was trained with model.name={saved}, not {cfg.model.name}. Resume "
            f"with model.name={saved}, or start a new run in another output_dir"
        )


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
