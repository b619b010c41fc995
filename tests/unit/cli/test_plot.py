"""Run logs and what reads them: RunLogger's JSONL/CSV/TensorBoard/wandb-offline outputs, the sweep summary
table, and the curves PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from grpo_rl.cli.plot import moving_average, plot_runs, series
from grpo_rl.cli.sweep_summary import find_runs, format_table, summarize_run, varying_keys
from grpo_rl.cli.sweep_summary import main as summary_main
from grpo_rl.run.metrics import RunLogger, read_jsonl


def _fake_run(path: Path, lr: str, steps: int = 12, *, eval_every: int = 4, finished: bool = True) -> Path:
    """A sweep job folder as the script leaves it: Hydra's overrides, metrics.jsonl, maybe final_model/."""
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text(f"- optimizer.lr={lr}\n- model.name=tiny\n- train.steps={steps}\n")
    logger = RunLogger(path, backend="none")
    scale = float(lr) * 1e4
    for step in range(1, steps + 1):
        metrics = {
            "reward_mean": 0.1 + 0.05 * step * scale,
            "reward_correct_mean": 0.02 * step * scale,
            "kl_ref": 0.001 * step**2,
            "response_length_mean": 100 - 2 * step,
        }
        if step % eval_every == 0:
            metrics.update({"eval/accuracy": 0.03 * step * scale, "eval/pass@4": 0.05 * step * scale})
        logger.log(step, metrics)
    logger.close()
    if finished:
        (path / "final_model").mkdir()
        (path / "final_model" / "config.json").write_text("{}")
    return path


@pytest.fixture
def sweep(tmp_path) -> Path:
    root = tmp_path / "multirun" / "2026-01-01" / "12-00-00"
    _fake_run(root / "0", "1e-4")
    _fake_run(root / "1", "1e-5", steps=6, finished=False)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root


def test_moving_average_by_hand():
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([2.0, 4.0, 9.0], 5) == [2.0, 3.0, 5.0]


def test_csv_gains_columns_when_a_new_metric_appears(tmp_path):
    logger = RunLogger(tmp_path, backend="none", csv=True)
    logger.log(1, {"reward_mean": 0.5})
    logger.log(2, {"reward_mean": 0.6, "eval/accuracy": 0.25})
    logger.log(3, {"reward_mean": 0.7})
    logger.close()
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "step,reward_mean,eval/accuracy",
        "1,0.5,",
        "2,0.6,0.25",
        "3,0.7,",
    ]
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_tensorboard_events_and_purge_on_rewind(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = RunLogger(tmp_path, backend="none", tensorboard=True)
    for step in (1, 2, 3):
        logger.log(step, {"reward_mean": float(step), "policy_version": step})
    logger.rewind(1)  # resumed from step 1's checkpoint: steps 2 and 3 are logged again
    for step in (2, 3):
        logger.log(step, {"reward_mean": 10.0 * step, "policy_version": step})
    logger.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward_mean")] == [(1, 1.0), (2, 20.0), (3, 30.0)]


@pytest.mark.slow
def test_wandb_runs_offline_under_the_run_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    logger = RunLogger(tmp_path, backend="wandb", project="grpo_rl_test", config={"seed": 0})
    assert logger._wandb is not None, "wandb did not start"
    logger.log(1, {"reward_mean": 0.5})
    logger.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_sweep_summary_table(sweep, capsys):
    runs = [summarize_run(p) for p in find_runs([sweep])]
    assert [r.name for r in runs] == ["0", "1"]
    assert varying_keys(runs) == ["optimizer.lr", "train.steps"]
    first = runs[0]
    assert first.steps == 12 and first.finished
    assert first.reward == pytest.approx(sum(0.1 + 0.05 * s for s in range(9, 13)) / 4)  # last min(5, 12 // 3) steps
    assert first.accuracy == pytest.approx(0.03 * 12) and first.pass_at_k == pytest.approx(0.05 * 12)
    second = runs[1]
    assert second.steps == 6 and not second.finished
    assert second.reward == pytest.approx((0.1 + 0.005 * 5 + 0.1 + 0.005 * 6) / 2)  # last 6 // 3 = 2 steps

    table = format_table(runs).splitlines()
    assert table[0] == "common overrides: model.name=tiny"
    assert table[1].split() == [
        "job",
        "optimizer.lr",
        "train.steps",
        "steps",
        "reward",
        "accuracy",
        "pass@k",
        "train_acc",
        "done",
    ]
    assert table[3].split()[:4] == ["0", "1e-4", "12", "12"] and table[4].split()[-1] == "no"

    summary_main([str(sweep), "--json", "--sort", "reward"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in rows] == ["0", "1"] and rows[0]["overrides"]["optimizer.lr"] == "1e-4"


def test_plot_writes_a_png_with_one_curve_per_run(sweep, tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    out = plot_runs(find_runs([sweep]), tmp_path / "curves.png", smooth=3)
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (1320, 880)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # curves, text and grid were drawn, not a blank canvas
    steps, values = series(read_jsonl(sweep / "0" / "metrics.jsonl"), "eval/accuracy")
    assert steps == [4, 8, 12] and not any(math.isnan(v) for v in values)


def test_find_runs_rejects_a_folder_without_runs(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        find_runs([tmp_path])
