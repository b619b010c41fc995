"""User errors: one message naming the input and the fix, exit status 2, no traceback; checked before anything
starts. Unknown command-line keys are rejected, with or without Hydra's ``+``; an ``output_dir`` that is a file is
refused before Hydra makes the folder; the evaluation command checks its checkpoint before loading it."""

from __future__ import annotations

import logging
import sys

import pytest
from omegaconf import OmegaConf

from grpo_rl.cli import evaluate
from grpo_rl.cli.entry import USER_ERROR_EXIT, check_output_dir_override, check_overrides, run_entry, user_errors
from grpo_rl.config.schema import GRPOConfig
from grpo_rl.errors import ConfigError, DataError, RunFolderError
from grpo_rl.run.checkpoint import CheckpointDamagedError, Checkpointer
from grpo_rl.run.preflight import validate


@pytest.mark.parametrize(
    "argv, key",
    [
        (["+train.foo=1"], "train.foo"),
        (["train.foo=1"], "train.foo"),
        (["++optimizer.lrr=1e-5"], "optimizer.lrr"),
        (["--multirun", "optimizer.lr=1e-4,1e-5", "+policy.kl=0.1"], "policy.kl"),
    ],
)
def test_unknown_keys_are_rejected_with_or_without_plus(argv, key):
    with pytest.raises(ConfigError, match=f"the config has no key '{key}'"):
        check_overrides(argv)


def test_a_misspelt_key_gets_a_suggestion():
    with pytest.raises(ConfigError, match="did you mean train.steps"):
        check_overrides(["train.stpes=3"])


@pytest.mark.parametrize(
    "argv",
    [
        ["optimizer.lr=1e-5", "train.steps=3"],
        ["--multirun", "optimizer.lr=1e-4,1e-5"],
        ["--config-name", "grpo_ifeval", "reward.ifeval_weights.inst_loose=0.5"],
        ["hydra.run.dir=/tmp/x", "hydra/job_logging=disabled"],
        ["reward.functions=[{path: r.py, name: f}]", "model.lora.target_modules=[q_proj]"],
        [],
    ],
)
def test_known_keys_and_hydra_options_pass(argv):
    check_overrides(argv)


def test_a_user_error_exits_2_with_one_line_and_no_traceback(capsys):
    @user_errors
    def task(cfg):
        raise DataError("data file /x.jsonl, line 3: not valid UTF-8; save the file as UTF-8")

    with pytest.raises(SystemExit) as exited:
        task(None)
    assert exited.value.code == USER_ERROR_EXIT
    err = capsys.readouterr().err
    assert err == "error: data file /x.jsonl, line 3: not valid UTF-8; save the file as UTF-8\n"


def test_an_unexpected_error_keeps_its_traceback():
    @user_errors
    def task(cfg):
        raise KeyError("bug")

    with pytest.raises(KeyError):
        task(None)


def _cfg(**values):
    cfg = OmegaConf.structured(GRPOConfig)
    for key, value in values.items():
        OmegaConf.update(cfg, key, value)
    return cfg


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("train.max_time_minutes", 0.0, "train.max_time_minutes=0.0 must be > 0, or null"),
        ("logger.examine_every", 0, "logger.examine_every=0 must be > 0"),
        ("seed", -1, "seed=-1 must be >= 0"),
        ("optimizer.beta1", 1.0, r"optimizer.beta1=1.0 must be in \[0, 1\)"),
        ("optimizer.beta2", -0.1, r"optimizer.beta2=-0.1 must be in \[0, 1\)"),
        ("inference_model.kv_cache_gb", 0.0, "inference_model.kv_cache_gb=0.0 must be > 0"),
        ("reward.correctness_weight", float("nan"), "reward.correctness_weight=nan must be a finite number"),
        ("reward.format_weight", float("inf"), "reward.format_weight=inf must be a finite number"),
        ("reward.model_weight", float("nan"), "reward.model_weight=nan must be a finite number"),
        ("reward.ifeval_weights.inst_strict", float("inf"), "reward.ifeval_weights.inst_strict=inf must be a finite"),
        ("optimizer.lr", float("nan"), "optimizer.lr=nan must be a finite number"),
        ("inference_model.gpu_memory_utilization", 0.0, r"gpu_memory_utilization=0.0 must be in \(0, 1\]"),
        ("train.keep_checkpoints", 0, "train.keep_checkpoints=0 must be > 0"),
    ],
)
def test_values_that_cannot_work_are_rejected(key, value, message):
    with pytest.raises(ConfigError, match=message):
        validate(_cfg(**{key: value}))


def test_the_defaults_are_valid():
    validate(_cfg())


# The run folder


def test_an_output_dir_that_is_a_file_ends_before_hydra_starts(tmp_path, monkeypatch, capsys):
    file = tmp_path / "results.csv"
    file.write_text("a,b\n")
    check_output_dir_override([f"output_dir={tmp_path / 'new'}", "train.steps=2"])  # a folder to be made is fine
    with pytest.raises(RunFolderError, match=f"^output_dir={file} is a file"):
        check_output_dir_override([f"output_dir={file}"])

    def hydra_main():
        raise AssertionError("Hydra must not start: it would make the folder and fail with a traceback")

    monkeypatch.setattr(sys, "argv", ["grpo.py", f"output_dir={file}"])
    with pytest.raises(SystemExit) as exited:
        run_entry(hydra_main)
    assert exited.value.code == USER_ERROR_EXIT
    assert capsys.readouterr().err == (
        f"error: output_dir={file} is a file, so the run cannot write there; set "
        "output_dir to a folder (it is made if it does not exist), or move that file "
        "away\n"
    )


# python -m grpo_rl.cli.evaluate checkpoint=...


def _checkpoints(tmp_path, model, tokenizer, steps=(1, 2)):
    ckp = Checkpointer(tmp_path, keep=0)
    return [ckp.save(step, model, tokenizer, {}) for step in steps]


def test_evaluate_takes_the_newest_intact_checkpoint_of_a_run_folder(tiny_model, tokenizer, tmp_path, caplog):
    first, second = _checkpoints(tmp_path, tiny_model, tokenizer)
    (second / "trainer_state.pt").write_bytes(b"cut")
    with caplog.at_level(logging.WARNING):
        assert evaluate.resolve_checkpoint(tmp_path) == first
    assert f"checkpoint {second} is damaged ({second / 'trainer_state.pt'} is 3 bytes" in caplog.text


def test_evaluate_refuses_a_damaged_checkpoint_in_one_line(tiny_model, tokenizer, tmp_path, monkeypatch, capsys):
    _, second = _checkpoints(tmp_path, tiny_model, tokenizer)
    weights = second / "model" / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:100])
    monkeypatch.setattr(sys, "argv", ["evaluate.py", f"checkpoint={second}"])
    capsys.readouterr()  # the saves' progress bars
    with pytest.raises(SystemExit) as exited:
        evaluate.cli()
    assert exited.value.code == USER_ERROR_EXIT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"error: checkpoint={second}: {weights} is 100 bytes, but {size} were written"
    )
    with pytest.raises(CheckpointDamagedError, match="^checkpoint=.*: all 2 checkpoints in .* are damaged; the newest"):
        (tmp_path / "checkpoints" / "step_00000001" / "trainer_state.pt").write_bytes(b"cut")
        evaluate.resolve_checkpoint(tmp_path)
