"""A damaged checkpoint is named, not loaded: the manifest written with every checkpoint, the checks before every
load, ``resume=auto`` falling back to the newest intact checkpoint, and checkpoints written before manifests."""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.errors import RunFolderError
from grpo_rl.run import checkpoint as ckpt_module
from grpo_rl.run import manifest
from grpo_rl.run.checkpoint import (
    CheckpointDamagedError,
    Checkpointer,
    checkpoint_damage,
    load_model_weights,
    load_trainer_state,
    verify_checkpoint,
)
from grpo_rl.run.lifecycle import check_run_folder, find_resume_checkpoint

WEIGHTS = "model/model.safetensors"


def _save(ckp: Checkpointer, step: int, model, tokenizer) -> Path:
    return ckp.save(step, model, tokenizer, {"learner": {"version": step}}, config_yaml="model:\n  name: tiny\n")


def _truncate(file: Path, keep: int = 1000) -> int:
    """Cut ``file`` to ``keep`` bytes, as an interrupted copy does; returns its size before."""
    size = file.stat().st_size
    data = file.read_bytes()[:keep]
    file.write_bytes(data)
    return size


def _cfg(resume) -> GRPOConfig:
    cfg = OmegaConf.structured(GRPOConfig)
    cfg.resume = resume
    cfg.model.name = "tiny"
    return cfg


def test_the_manifest_lists_every_file_with_its_size_and_sha256(tiny_model, tokenizer, tmp_path):
    path = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    written = json.loads((path / "manifest.json").read_text())
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert written["hash"] == "sha256" and sorted(written["files"]) == [f for f in files if f != "manifest.json"]
    assert {WEIGHTS, "trainer_state.pt", "config.yaml", "model/config.json"} <= set(written["files"])
    for name, entry in written["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert checkpoint_damage(path) is None


def test_files_added_later_are_not_checked(tiny_model, tokenizer, tmp_path):
    path = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    (path / "eval_results.json").write_text("{}")  # what python -m grpo_rl.cli.evaluate writes there
    verify_checkpoint(path)


def test_a_truncated_weights_file_is_named_with_both_sizes_before_anything_loads(tiny_model, tokenizer, tmp_path):
    path = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    size = _truncate(path / WEIGHTS)
    damage = checkpoint_damage(path)
    assert damage.file == (path / WEIGHTS)
    assert damage.problem.startswith(f"is 1000 bytes, but {size} were written")
    for load in (lambda: load_model_weights(path, tiny_model), lambda: load_trainer_state(path)):
        with pytest.raises(CheckpointDamagedError) as info:
            load()
        message = str(info.value)
        assert isinstance(info.value, RunFolderError) and "\n" not in message
        assert message.startswith(
            f"{path / WEIGHTS} is 1000 bytes, but {size} were written (cut short or changed "
            "after the save), so the checkpoint cannot be loaded"
        )
        assert message.endswith(
            "Use another checkpoint (resume=auto, or the evaluation's checkpoint=<run dir>, takes "
            "the newest intact one of a run), or copy this one again from where it came from"
        )


def test_changed_bytes_of_the_same_size_are_found_by_the_hash(tiny_model, tokenizer, tmp_path):
    path = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    file = path / "trainer_state.pt"
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    expected = hashlib.sha256(file.read_bytes()).hexdigest()
    file.write_bytes(bytes(data))
    damage = checkpoint_damage(path)
    assert damage.file == file
    assert damage.problem == (
        f"has changed since it was written: its sha256 is "
        f"{hashlib.sha256(bytes(data)).hexdigest()[:16]}..., {expected[:16]}... when written "
        "(same size, other bytes)"
    )


def test_a_missing_file_and_a_broken_manifest_are_damage(tiny_model, tokenizer, tmp_path):
    path = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    (path / "model" / "config.json").unlink()
    assert checkpoint_damage(path).problem.startswith("is missing (it was written with the checkpoint")
    (path / "manifest.json").write_text('{"files": ')
    damage = checkpoint_damage(path)
    assert damage.file == (path / "manifest.json") and "cannot be read as a manifest" in damage.problem


def test_a_folder_is_hashed_again_only_when_a_file_changes(tiny_model, tokenizer, tmp_path, monkeypatch):
    path = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    hashed = []
    real = manifest.file_sha256
    monkeypatch.setattr(manifest, "file_sha256", lambda f: hashed.append(f.name) or real(f))
    assert checkpoint_damage(path) is None and checkpoint_damage(path) is None
    files = len(json.loads((path / "manifest.json").read_text())["files"])
    assert len(hashed) == files  # the second look reused the first
    (path / "config.yaml").write_text("model:\n  name: other\n")
    assert "config.yaml" in str(checkpoint_damage(path).file)


# resume


def test_resume_auto_falls_back_to_the_newest_intact_checkpoint_with_one_warning(
    tiny_model, tokenizer, tmp_path, caplog
):
    ckp = Checkpointer(tmp_path, keep=0)
    first = _save(ckp, 1, tiny_model, tokenizer)
    second = _save(ckp, 2, tiny_model, tokenizer)
    size = _truncate(second / WEIGHTS)
    cfg = _cfg("auto")
    with caplog.at_level(logging.WARNING, logger="grpo_rl.run.checkpoint"):
        check_run_folder(cfg, tmp_path)  # at start
        assert find_resume_checkpoint(cfg, Checkpointer(tmp_path)) == first  # then the load
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"checkpoint {second} is damaged ({second / WEIGHTS} is 1000 bytes, but {size} were written "
        "(cut short or changed after the save)); using step_00000001, the newest intact one, instead"
    ]
    load_model_weights(first, tiny_model)


def test_resume_auto_with_no_intact_checkpoint_is_one_error(tiny_model, tokenizer, tmp_path, caplog):
    only = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    _truncate(only / WEIGHTS)
    with pytest.raises(RunFolderError) as info, caplog.at_level(logging.WARNING):
        check_run_folder(_cfg("auto"), tmp_path)
    assert not caplog.records  # the error says it all
    message = str(info.value)
    assert message.startswith(
        f"resume=auto: the only checkpoint in {tmp_path / 'checkpoints'} is damaged: {(only / WEIGHTS)} is 1000 bytes"
    )
    assert message.endswith("Restore the checkpoints from a copy, or start a new run in another output_dir")


def test_an_explicit_damaged_checkpoint_is_an_error_not_a_fallback(tiny_model, tokenizer, tmp_path):
    ckp = Checkpointer(tmp_path, keep=0)
    _save(ckp, 1, tiny_model, tokenizer)
    second = _save(ckp, 2, tiny_model, tokenizer)
    _truncate(second / WEIGHTS)
    with pytest.raises(
        RunFolderError,
        match=rf"^resume={second}: {second / WEIGHTS} is 1000 bytes, but \d+ were "
        "written",
    ):
        check_run_folder(_cfg(str(second)), tmp_path)


def test_a_resumed_run_removes_the_newer_checkpoints_of_the_history_it_replaces(
    tiny_model, tokenizer, tmp_path, caplog
):
    old = Checkpointer(tmp_path, keep=0)
    for step in (1, 2, 3):
        _save(old, step, tiny_model, tokenizer)
    _truncate(old.root / "step_00000003" / WEIGHTS)
    resumed = Checkpointer(tmp_path, keep=1)  # resumed from step 2, and step 3 is saved again later
    with caplog.at_level(logging.WARNING, logger="grpo_rl.run.checkpoint"):
        _save(resumed, 2, tiny_model, tokenizer)
    # keep=1 keeps this run's step 2, not the damaged step 3 of the old history
    assert [p.name for p in resumed.list()] == ["step_00000002"]
    assert "step_00000003, a checkpoint of the history this run replaced" in caplog.text


# checkpoints written before manifests existed


def test_a_checkpoint_without_a_manifest_loads_as_before(tiny_model, tokenizer, tmp_path):
    path = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    (path / "manifest.json").unlink()
    assert checkpoint_damage(path) is None
    assert load_trainer_state(path)["step"] == 1
    load_model_weights(path, tiny_model)


def test_without_a_manifest_a_truncated_file_is_still_named(tiny_model, tokenizer, tmp_path):
    path = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    (path / "manifest.json").unlink()
    _truncate(path / "trainer_state.pt")  # found by its missing zip directory, before any load
    with pytest.raises(
        CheckpointDamagedError,
        match=rf"^{path / 'trainer_state.pt'} is not a whole torch file "
        r"\(1000 bytes without the zip directory",
    ):
        load_trainer_state(path)
    _truncate(path / WEIGHTS)  # found by its header
    assert "is truncated" in checkpoint_damage(path).problem
    with pytest.raises(CheckpointDamagedError, match=rf"^{path / WEIGHTS} is truncated"):
        load_model_weights(path, tiny_model)


def test_without_a_manifest_a_state_that_fails_to_load_is_named_unless_the_file_is_whole(
    tiny_model, tokenizer, tmp_path, monkeypatch
):
    path = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    (path / "manifest.json").unlink()
    file = path / "trainer_state.pt"
    data = bytearray(file.read_bytes())
    data[:4] = b"\0\0\0\0"  # the zip's first header gone: torch would try its legacy format
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointDamagedError, match=rf"^{file} does not start as a torch file does"):
        load_trainer_state(path)
    data[:4] = b"PK\x03\x04"
    file.write_bytes(bytes(data))

    def fails(*args, **kwargs):
        raise RuntimeError("PytorchStreamReader failed reading file data/0: invalid header. More words")

    monkeypatch.setattr(ckpt_module.torch, "load", fails)
    with pytest.raises(
        CheckpointDamagedError,
        match=rf"^{file} is damaged \(RuntimeError: PytorchStreamReader failed "
        r"reading file data/0: invalid header\), so the checkpoint",
    ):
        load_trainer_state(path)

    def refuses(*args, **kwargs):
        raise pickle.UnpicklingError("Weights only load failed: Unsupported global: GLOBAL foo.Bar")

    monkeypatch.setattr(ckpt_module.torch, "load", refuses)
    with pytest.raises(pickle.UnpicklingError):  # a whole file with a type the state must not hold: a bug
        load_trainer_state(path)


def test_without_a_manifest_a_weights_file_that_fails_to_load_is_named(tiny_model, tokenizer, tmp_path):
    path = _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    (path / "manifest.json").unlink()
    file = path / WEIGHTS
    data = file.read_bytes()
    assert b'"F32"' in data
    file.write_bytes(data.replace(b'"F32"', b'"Q32"', 1))  # a header that parses, with a dtype that does not
    assert checkpoint_damage(path) is None  # the header checks cannot tell
    with pytest.raises(
        CheckpointDamagedError,
        match=rf"^{file} is damaged \(SafetensorError: .*\), so the "
        "checkpoint cannot be loaded",
    ):
        load_model_weights(path, tiny_model)
