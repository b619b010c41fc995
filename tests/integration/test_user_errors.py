"""User errors through the real script: one line naming the input and the fix, exit status 2, no traceback, and
before any engine starts (the model folders here have no weights at all: an engine that started would fail on
them first, with another message)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.helpers import run_script, tiny_overrides

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def weightless_model_dir(tiny_model_dir: Path, tmp_path_factory) -> Path:
    """The tiny model's config and tokenizer without its weights."""
    out = tmp_path_factory.mktemp("weightless")
    for file in tiny_model_dir.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, out / file.name)
    return out


def _fails_cleanly(result, *fragments: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]


def test_unknown_key_with_plus(tmp_path):
    _fails_cleanly(
        run_script("grpo.py", "+train.foo=1", f"output_dir={tmp_path}"), "train.foo", "grpo_rl/config/schema.py"
    )


def test_a_value_hydra_cannot_convert_exits_2(tmp_path):
    result = run_script("grpo.py", "train.steps=abc", f"output_dir={tmp_path}")
    assert result.returncode == 2 and "train.steps" in result.stderr


def test_bad_value(tmp_path):
    _fails_cleanly(run_script("grpo-async.py", "optimizer.beta2=1.5", f"output_dir={tmp_path}"), "optimizer.beta2")


def test_a_torchrl_key_and_the_setting_it_maps_to_disagree(tmp_path):
    """TorchRL's train.total_dialog_turns=3200 is 100 steps of the default 4 x 8 answers; train.steps=50 too is a
    conflict, refused by the check of the values, before a model is resolved."""
    result = run_script("grpo.py", "train.total_dialog_turns=3200", "train.steps=50", f"output_dir={tmp_path}")
    _fails_cleanly(result, "train.total_dialog_turns=3200", "train.steps=100", "train.steps=50")


def test_non_utf8_data_is_reported_with_file_and_line_before_the_engine(weightless_model_dir, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_bytes(b'{"prompt": "ok", "ground_truth": "1"}\n{"prompt": "caf\xe9", "ground_truth": "2"}\n')
    reward = tmp_path / "reward.py"
    reward.write_text("def score(responses, references):\n    return [0.0 for _ in responses]\n")
    result = run_script(
        "grpo.py",
        *tiny_overrides(weightless_model_dir, tmp_path / "run"),
        "env.dataset=file",
        f"env.path={data}",
        f"reward.path={reward}",
        "reward.name=score",
    )
    _fails_cleanly(result, f"{data}:2", "UTF-8")  # file:line


def test_an_uncached_hub_dataset_offline_is_reported_before_the_engine(weightless_model_dir, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("def score(responses, references):\n    return [0.0 for _ in responses]\n")
    result = run_script(
        "grpo-async.py",
        *tiny_overrides(weightless_model_dir, tmp_path / "run"),
        "env.dataset=file",
        "env.hub_dataset=grpo-rl-tests/not-cached",
        f"reward.path={reward}",
        "reward.name=score",
    )
    _fails_cleanly(result, "env.hub_dataset=grpo-rl-tests/not-cached", "HF_HUB_OFFLINE=0", "env.path=prompts.jsonl")


def test_a_truncated_weights_file_is_named(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = run_script("grpo.py", *tiny_overrides(model, tmp_path / "run"))
    _fails_cleanly(result, str(weights), "truncated")


def test_a_reward_that_exits_at_import(weightless_model_dir, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("import sys\nsys.exit(3)\n")
    result = run_script(
        "grpo.py", *tiny_overrides(weightless_model_dir, tmp_path / "run"), f"reward.path={reward}", "reward.name=score"
    )
    _fails_cleanly(result, str(reward))


def test_a_fresh_run_refuses_another_runs_folder(weightless_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_00000004").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 4}\n')
    result = run_script("grpo.py", *tiny_overrides(weightless_model_dir, run_dir))
    _fails_cleanly(result, "already holds checkpoints", "resume=auto")
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 4}\n'  # nothing of the old run was touched


def test_hydra_files_go_into_output_dir(weightless_model_dir, tmp_path):
    """With output_dir set, Hydra's .hydra/ and log land in it, not in ./outputs of the working directory."""
    run_dir = tmp_path / "run"
    result = run_script("grpo.py", *tiny_overrides(weightless_model_dir, run_dir), "seed=-1", cwd=tmp_path)
    assert result.returncode == 2
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert not (tmp_path / "outputs").exists()
