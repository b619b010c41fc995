"""What a crash leaves behind: checkpoints, exports and logs are either complete or absent, never half-written.

A crash is simulated three ways: an exception raised in the middle of writing (the save's own clean-up runs),
the debris a killed process would leave (a ``.tmp-*`` folder, a folder moved aside before its replacement
landed, a half-written JSONL line), and a loop stopped mid-step (:meth:`CheckpointManager.finish`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.run import atomic_fs
from grpo_rl.run import checkpoint as ckpt
from grpo_rl.run.checkpoint import Checkpointer, export_model_atomic, load_model_weights, load_trainer_state
from grpo_rl.run.checkpoint_manager import CheckpointManager
from grpo_rl.run.metrics import RunLogger, read_jsonl
from grpo_rl.run.step_log import StepLog


class _Env:
    """Stands in for a PromptEnv: only the data position matters here."""

    def __init__(self):
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


class _Learner:
    def __init__(self, model):
        self.model = model
        self.version = 0
        self.skipped_steps = 0
        self.lost = False

    def state_dict(self) -> dict:
        return {"version": self.version, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.version, self.skipped_steps = state["version"], state["skipped_steps"]


def _save(ckp: Checkpointer, step: int, model, tokenizer) -> Path:
    return ckp.save(step, model, tokenizer, {"learner": {"version": step}})


def test_save_round_trip_restores_weights_state_and_rng(tiny_model, tokenizer, tmp_path):
    ckp = Checkpointer(tmp_path, keep=0)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = _save(ckp, 3, tiny_model, tokenizer)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(2), np.random.seed(2), torch.manual_seed(2)

    state = load_trainer_state(path)
    ckp_state = {k: state[k] for k in ("step", "learner")}
    assert ckp_state == {"step": 3, "learner": {"version": 3}}
    ckpt.set_rng_state(state["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected

    with torch.no_grad():
        original = {k: v.clone() for k, v in tiny_model.state_dict().items()}
        for p in tiny_model.parameters():
            p.add_(1.0)
    load_model_weights(path, tiny_model)
    for key, value in tiny_model.state_dict().items():
        assert torch.equal(value, original[key]), key
    assert ckp.latest() == path
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "model", "trainer_state.pt"]


def test_exception_during_save_leaves_previous_checkpoint_and_no_debris(tiny_model, tokenizer, tmp_path, monkeypatch):
    ckp = Checkpointer(tmp_path, keep=2)
    first = _save(ckp, 1, tiny_model, tokenizer)

    def torn_write(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"half a checkpoint")  # the file exists, truncated, when the crash hits
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", torn_write)
    with pytest.raises(OSError, match="disk full"):
        _save(ckp, 2, tiny_model, tokenizer)
    assert ckp.list() == [first]
    assert sorted(p.name for p in ckp.root.iterdir()) == ["step_00000001"]
    assert load_trainer_state(first)["step"] == 1


def test_debris_of_a_killed_save_is_ignored_and_cleaned(tiny_model, tokenizer, tmp_path):
    ckp = Checkpointer(tmp_path, keep=2)
    first = _save(ckp, 1, tiny_model, tokenizer)
    # A process killed mid-write leaves its temporary folder, with or without trainer_state.pt in it.
    torn = ckp.root / ".tmp-step_00000002-abc123"
    (torn / "model").mkdir(parents=True)
    (torn / "model" / "model.safetensors").write_bytes(b"\0" * 10)
    (torn / "trainer_state.pt").write_bytes(b"garbage")
    assert ckp.latest() == first

    second = _save(ckp, 2, tiny_model, tokenizer)
    assert ckp.list() == [first, second]
    assert not list(ckp.root.glob(".tmp-*"))


def test_killed_between_renames_of_a_resave_keeps_the_old_folder(tiny_model, tokenizer, tmp_path, monkeypatch):
    ckp = Checkpointer(tmp_path, keep=1)
    first = _save(ckp, 5, tiny_model, tokenizer)
    real_replace = atomic_fs.os.replace
    calls = []

    def failing_second_rename(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:  # old folder already moved aside; the new one never lands
            raise OSError("killed")
        real_replace(src, dst)

    monkeypatch.setattr(atomic_fs.os, "replace", failing_second_rename)
    with pytest.raises(OSError, match="killed"):
        ckp.save(5, tiny_model, tokenizer, {"learner": {"version": 99}})
    monkeypatch.setattr(atomic_fs.os, "replace", real_replace)
    assert ckp.latest() == first and load_trainer_state(first)["learner"] == {"version": 5}

    # A hard kill at the same point leaves the old folder moved aside; the next look puts it back.
    real_replace(first, ckp.root / ".old-step_00000005-4242")
    assert ckp.latest() == first and load_trainer_state(first)["learner"] == {"version": 5}


def test_keep_prunes_oldest(tiny_model, tokenizer, tmp_path):
    ckp = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        _save(ckp, step, tiny_model, tokenizer)
    assert [p.name for p in ckp.list()] == ["step_00000002", "step_00000003"]


def test_failed_export_keeps_previous_final_model(tiny_model, tokenizer, tmp_path, monkeypatch):
    out = export_model_atomic(tiny_model, tokenizer, tmp_path / "final_model")
    before = (out / "model.safetensors").read_bytes()

    def crash(*args, **kwargs):
        raise RuntimeError("crash while writing")

    monkeypatch.setattr(tokenizer, "save_pretrained", crash)
    with pytest.raises(RuntimeError):
        export_model_atomic(tiny_model, tokenizer, tmp_path / "final_model")
    assert (out / "model.safetensors").read_bytes() == before and (out / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model"]


def test_rewind_drops_steps_after_the_checkpoint_and_torn_lines(tmp_path):
    logger = RunLogger(tmp_path, backend="none", csv=True)
    for step in (1, 2, 3):
        logger.log(step, {"loss": float(step)})
    logger.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "loss": 4.')  # killed mid-write
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))

    resumed = RunLogger(tmp_path, backend="none", resume=True, csv=True)
    resumed.rewind(2)
    resumed.log(3, {"loss": 30.0})
    resumed.close()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 1, "loss": 1.0},
        {"step": 2, "loss": 2.0},
        {"step": 3, "loss": 30.0},
    ]
    assert [r["step"] for r in read_jsonl(tmp_path / "samples.jsonl")] == [1, 2]
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,loss", "1,1.0", "2,2.0", "3,30.0"]


@pytest.fixture
def checkpoints(tmp_path, tiny_model, tokenizer):
    cfg = OmegaConf.structured(GRPOConfig)
    cfg.output_dir = str(tmp_path)
    cfg.logger.num_examine = 0
    logger = RunLogger(tmp_path, backend="none")
    yield CheckpointManager(cfg, tmp_path, _Learner(tiny_model), _Env(), tokenizer, StepLog(cfg, tmp_path, logger))
    logger.close()


def _stop_mid_step(checkpoints: CheckpointManager, *, update_learner: bool) -> None:
    """Run one step to completion, start another, and stop it with an exception, as the script's loop would."""
    learner, env = checkpoints.learner, checkpoints.source
    with pytest.raises(KeyboardInterrupt):
        try:
            env.position += 2  # step 1: collect ...
            learner.version += 1  # ... train
            checkpoints.steps.record({"reward_mean": 0.5}, batch=None)
            checkpoints.step_done()
            env.position += 2  # step 2 has drawn its prompts ...
            if update_learner:
                learner.version += 1  # ... and even updated the model
            raise KeyboardInterrupt
        finally:
            checkpoints.finish()


def test_stop_before_the_update_checkpoints_the_step_boundary(checkpoints):
    checkpoints.resume(weight_sync=None)
    _stop_mid_step(checkpoints, update_learner=False)
    state = load_trainer_state(checkpoints.store.latest())
    assert state["step"] == 1 and state["env"] == {"position": 2} and state["learner"]["version"] == 1
    assert (checkpoints.run_dir / "final_model" / "config.json").exists()


def test_stop_after_the_update_writes_no_checkpoint(checkpoints):
    checkpoints.resume(weight_sync=None)
    _stop_mid_step(checkpoints, update_learner=True)
    assert checkpoints.store.latest() is None
    assert not (checkpoints.run_dir / "final_model").exists()


def test_resuming_with_changed_settings_is_reported():
    from grpo_rl.run.lifecycle import config_changes

    saved = OmegaConf.structured(GRPOConfig)
    now = OmegaConf.structured(GRPOConfig)
    now.train.steps, now.resume, now.eval.every = 99, "auto", 5  # harmless: how long, whether, how often to look
    assert config_changes(OmegaConf.to_yaml(saved), now) == []
    now.optimizer.lr = 1e-3
    assert config_changes(OmegaConf.to_yaml(saved), now) == ["optimizer.lr: 2e-05 -> 0.001"]


def test_a_checkpoint_saved_with_train_epochs_resumes_as_updates_per_batch():
    from grpo_rl.run.lifecycle import config_changes

    saved = OmegaConf.to_container(OmegaConf.structured(GRPOConfig))
    del saved["train"]["updates_per_batch"], saved["train"]["prompt_epochs"]
    saved["train"]["epochs"] = 2  # the config.yaml of a checkpoint written before the rename
    now = OmegaConf.structured(GRPOConfig)
    now.train.updates_per_batch, now.train.prompt_epochs = 2, 3.0  # prompt_epochs only sets the run's length
    assert config_changes(OmegaConf.to_yaml(OmegaConf.create(saved)), now) == []
    now.train.updates_per_batch = 1
    assert config_changes(OmegaConf.to_yaml(OmegaConf.create(saved)), now) == ["train.updates_per_batch: 2 -> 1"]
