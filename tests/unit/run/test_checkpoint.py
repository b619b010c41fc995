"""Tests for grpo_rl.run.checkpoint: atomic saves, listing and pruning, crash safety, safe loading, RNG round trip."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_rl.run.checkpoint import Checkpointer, load_trainer_state, rng_state, set_rng_state
from grpo_rl.training.learner import Learner, LossSettings


@pytest.fixture
def ckpt(tmp_path: Path) -> Checkpointer:
    return Checkpointer(tmp_path / "run", keep=2)


def _save(ckpt: Checkpointer, step: int, model, tokenizer, **state) -> Path:
    return ckpt.save(step, model, tokenizer, {"env": {"epoch": 0, "position": step}, **state})


def test_save_list_latest_and_prune(ckpt, tiny_model, tokenizer):
    assert ckpt.list() == [] and ckpt.latest() is None
    first = _save(ckpt, 1, tiny_model, tokenizer)
    assert first == ckpt.root / "step_00000001"
    assert (first / "model" / "config.json").is_file()
    assert (first / "model" / "model.safetensors").is_file()
    assert (first / "model" / "tokenizer.json").is_file()
    assert (first / "trainer_state.pt").is_file()
    _save(ckpt, 2, tiny_model, tokenizer)
    _save(ckpt, 10, tiny_model, tokenizer)  # sorted by step number, not by name
    assert [p.name for p in ckpt.list()] == ["step_00000002", "step_00000010"]
    assert ckpt.latest().name == "step_00000010"
    assert not first.exists()
    assert sorted(p.name for p in ckpt.root.iterdir()) == ["step_00000002", "step_00000010"]


def test_keep_zero_keeps_all(tmp_path, tiny_model, tokenizer):
    ckpt = Checkpointer(tmp_path, keep=0)
    for step in (1, 2, 3):
        _save(ckpt, step, tiny_model, tokenizer)
    assert len(ckpt.list()) == 3


def test_saved_model_loads_with_the_same_weights(ckpt, tiny_model, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _save(ckpt, 5, tiny_model, tokenizer)
    loaded = AutoModelForCausalLM.from_pretrained(path / "model")
    for (name, a), b in zip(tiny_model.state_dict().items(), loaded.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, atol=0, rtol=0, msg=name)
    assert AutoTokenizer.from_pretrained(path / "model").encode("Hello there") == tokenizer.encode("Hello there")


def test_crash_during_save_leaves_previous_checkpoint(ckpt, tiny_model, tokenizer, monkeypatch):
    good = _save(ckpt, 1, tiny_model, tokenizer)

    def crashing_save(obj, f, *args, **kwargs):
        with open(f, "wb") as fh:
            fh.write(b"PK\x03\x04 half a file")  # a partial write, then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(OSError, match="No space"):
        _save(ckpt, 2, tiny_model, tokenizer)
    monkeypatch.undo()

    assert [p.name for p in ckpt.root.iterdir()] == ["step_00000001"]  # no step_2, no .tmp-* left
    assert ckpt.latest() == good
    assert load_trainer_state(ckpt.latest())["step"] == 1


def test_incomplete_folders_are_ignored_and_cleaned(ckpt, tiny_model, tokenizer):
    _save(ckpt, 1, tiny_model, tokenizer)
    # What a killed process leaves: a temporary folder, and (from an older layout) a step folder without state.
    (ckpt.root / ".tmp-step_00000002-abc" / "model").mkdir(parents=True)
    (ckpt.root / ".tmp-step_00000002-abc" / "trainer_state.pt").write_bytes(b"junk")
    (ckpt.root / "step_00000003" / "model").mkdir(parents=True)
    assert [p.name for p in ckpt.list()] == ["step_00000001"]
    _save(ckpt, 4, tiny_model, tokenizer)
    assert not (ckpt.root / ".tmp-step_00000002-abc").exists()
    assert ckpt.latest().name == "step_00000004"


def test_trainer_state_loads_with_weights_only(ckpt, tiny_model, tokenizer):
    from tensordict import TensorDict

    learner = Learner(tiny_model, torch.device("cpu"), LossSettings(), lr=1e-3, warmup_steps=2)
    batch = TensorDict(
        {
            "prompt_ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
            "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
            "response_ids": torch.tensor([[10, 11], [12, 0]]),
            "response_mask": torch.tensor([[1, 1], [1, 0]]),
            "behavior_logprobs": torch.zeros(2, 2),
            "advantage": torch.tensor([1.0, -1.0]),
        },
        batch_size=[2],
    )
    learner.train_step(batch)
    path = _save(ckpt, 3, tiny_model, tokenizer, learner=learner.state_dict(), wall_seconds=12.5)

    state = load_trainer_state(path)  # torch.load(..., weights_only=True) inside
    assert state["step"] == 3
    assert state["env"] == {"epoch": 0, "position": 3}
    assert state["wall_seconds"] == 12.5
    assert state["learner"]["version"] == 1
    restored = Learner(tiny_model, torch.device("cpu"), LossSettings(), lr=1e-3, warmup_steps=2)
    restored.load_state_dict(state["learner"])
    exp_avg = learner.optimizer.state_dict()["state"][0]["exp_avg"]
    torch.testing.assert_close(restored.optimizer.state_dict()["state"][0]["exp_avg"], exp_avg)
    assert restored.scheduler.last_epoch == 1
    # and it really is a weights-only file: nothing in it needs arbitrary unpickling
    torch.load(path / "trainer_state.pt", weights_only=True)


def test_load_trainer_state_on_a_non_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        load_trainer_state(tmp_path)


def _draws():
    return (
        random.random(),
        random.randint(0, 10**9),
        np.random.rand(3).tolist(),
        float(np.random.randn()),
        torch.rand(3).tolist(),
        torch.randint(0, 1000, (2,)).tolist(),
    )


def test_rng_state_round_trip():
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    np.random.randn()  # leaves a cached Gaussian in numpy's legacy state, which must round-trip too
    state = rng_state()
    first = _draws()
    random.seed(2)
    np.random.seed(2)
    torch.manual_seed(2)
    assert _draws() != first
    set_rng_state(state)
    assert _draws() == first


def test_rng_state_round_trip_through_a_checkpoint(ckpt, tiny_model, tokenizer):
    np.random.randn()
    path = _save(ckpt, 1, tiny_model, tokenizer)
    first = _draws()  # what the run would have drawn next
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    set_rng_state(load_trainer_state(path)["rng"])
    assert _draws() == first
