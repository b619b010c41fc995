"""The run report: the data a page embeds for a run folder written by hand, a sweep of two runs, a run with a
restart; the token-by-token answers the sample log writes; the refresh during a run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tensordict import NonTensorStack, TensorDict

from grpo_rl.algo.loss import LossSettings
from grpo_rl.cli.report import main, report_runs
from grpo_rl.config.schema import GRPOConfig
from grpo_rl.run.report import build_report, refresh_report, write_report
from grpo_rl.run.report.charts import nice_ticks
from grpo_rl.run.report.data import spread
from grpo_rl.run.sample_log import TokenDetail, group_answers
from grpo_rl.run.step_log import StepLog

LOG = """[2026-01-01 12:00:00,000][grpo_rl.run.setup][INFO] - GRPO (synchronous, sota/grpo.py): 4 steps
  role         where                     devices                     threads
  learner      driver process            cpu                         2
[2026-01-01 12:00:01,000][grpo_rl.run.checkpoint][WARNING] - checkpoint step_00000002 is damaged (model.pt): skipped
[2026-01-01 12:00:02,000][grpo_rl.run.loop][ERROR] - weight push to engine 0 failed: connection reset
[2026-01-01 12:00:03,000][grpo_rl.run.step_log][INFO] - step 1/4 | reward 0.5
"""


def _answer(reward: float, advantage: float, **extra) -> dict:
    return {
        "response": "4</script>",
        "reward": reward,
        "reward_correct": reward,
        "advantage": advantage,
        "tokens": ["4", "</script>"],
        "logprob": [-0.5, -1.0],
        **extra,
    }


def make_run(run_dir: Path, steps: int = 4, lr: str = "1e-5", restart: bool = False) -> Path:
    """A run folder as a run leaves it: metrics, samples with token data, trace, log, config."""
    run_dir.mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text(f"optimizer:\n  lr: {lr}\n")
    (run_dir / ".hydra" / "overrides.yaml").write_text(f"- optimizer.lr={lr}\n")
    rows = []
    for s in range(1, steps + 1):
        row = {"step": s, "reward_mean": s / 10, "reward_correct_mean": s / 20, "kl_ref": 0.01 * s, "entropy": 2.0}
        row |= {"generation_seconds": 1.0, "training_seconds": 0.5, "step_seconds": 1.6, "tokens_per_second": 100.0}
        if s % 2 == 0:
            row["eval/accuracy"] = s / 8
        if restart:
            row["restarts/learner"] = float(s >= 3)
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = [
        _answer(1.0, 0.5, learner_logprob=[-0.4, -2.5], engine_outside=[1], policy_version=1),
        _answer(0.0, -0.5, learner_logprob=[-0.5, -1.0], engine_outside=[], policy_version=2, context=[[1, 2]]),
    ]
    samples = [
        {"step": 1, "prompt": "<|im_start|>user\nWhat is 2+2?<|im_end|>", "response": "4", "reward": 1.0},
        {"step": 2, "prompt": "<|im_start|>user\nWhat is 2+2?<|im_end|>", "response": "4", "reward": 1.0}
        | {"reference": "4", "advantage": 0.5, "answers": answers},
    ]
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    events = [
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "driver"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "loop"}},
        {"ph": "M", "name": "process_name", "pid": 8, "args": {"name": "collector 0"}},
        {"ph": "M", "name": "thread_name", "pid": 8, "tid": 1, "args": {"name": "engine"}},
    ]
    for s in range(1, steps + 1):
        t = 1_000_000 * s
        events += [
            {"ph": "X", "name": "wait for batch", "pid": 7, "tid": 1, "ts": t, "dur": 100_000, "args": {"step": s}},
            {"ph": "X", "name": "train", "pid": 7, "tid": 1, "ts": t + 100_000, "dur": 500_000},
            {"ph": "X", "name": "generate", "pid": 8, "tid": 1, "ts": t, "dur": 800_000, "args": {"batch": s}},
        ]
    (run_dir / "trace.json").write_text(json.dumps({"displayTimeUnit": "ms", "traceEvents": events}))
    (run_dir / "grpo.log").write_text(LOG)
    if restart:
        restart_row = {"time": 1.0, "role": "learner", "replica": 0, "cause": "rank 1 died", "seconds": 2.5, "step": 2}
        (run_dir / "restarts.jsonl").write_text(json.dumps(restart_row) + "\n")
    return run_dir


def embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_report_embeds_the_run(tmp_path):
    run = make_run(tmp_path / "run")
    page = write_report([("run", run)], run / "report.html").read_text()
    data = embedded(page)
    titles = [p["title"] for p in data["panels"]]
    assert titles[:3] == [
        "reward (train batch mean)",
        "reward components (accuracy, format rate, ...)",
        "held-out evaluation",
    ]
    reward = data["panels"][0]["series"][0]
    assert reward["steps"] == [1, 2, 3, 4] and reward["values"] == [0.1, 0.2, 0.3, 0.4]
    assert data["panels"][2]["series"][0]["steps"] == [2, 4]  # eval points only where the run evaluated
    assert page.count('class="eval"') == 2 * len(data["panels"])  # eval steps marked in every panel
    (r,) = data["runs"]
    assert r["timeline"]["lanes"] == ["driver / loop", "collector 0 / engine"]
    assert r["timeline"]["steps"] == [[1, 0.0], [2, 1000.0], [3, 2000.0], [4, 3000.0]]
    assert [0, 2, 100.0, 500.0, -1] in r["timeline"]["spans"]  # the first train span: lane, name, ms, ms, no step
    assert r["samples"]["2"][0]["question"] == "What is 2+2?"
    first, second = r["samples"]["2"][0]["answers"]
    assert first["learner_logprob"] == [-0.4, -2.5] and first["engine_outside"] == [1]
    assert second["context"] == [[1, 2]]
    assert "answers" not in r["samples"]["1"][0]
    assert "</script>" not in page.split('id="report-data">')[1].split("</script>")[0]  # the answer's text escaped
    assert "damaged (model.pt)" in page and "weight push to engine 0 failed" in page
    assert "learner      driver process" in page and "lr: 1e-5" in page  # placement table and config
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "<link" not in page  # nothing external


def test_events_are_classified(tmp_path):
    from grpo_rl.run.report.data import events

    kinds = [e["kind"] for e in events(make_run(tmp_path / "run", restart=True))]
    assert kinds == ["restart", "damaged checkpoint", "push failed"]


def test_sweep_of_two_runs_overlaid(tmp_path):
    sweep = tmp_path / "sweep"
    make_run(sweep / "0", lr="1e-5")
    make_run(sweep / "1", lr="3e-5", steps=6)
    runs = report_runs([sweep])
    assert [label for label, _ in runs] == ["optimizer.lr=1e-5", "optimizer.lr=3e-5"]
    out = main([str(sweep)])
    assert out == sweep / "report.html"
    data = embedded(out.read_text())
    assert [r["label"] for r in data["runs"]] == ["optimizer.lr=1e-5", "optimizer.lr=3e-5"]
    reward = data["panels"][0]["series"]
    assert [(s["run"], s["steps"][-1]) for s in reward] == [(0, 4), (1, 6)]
    assert data["x"] == [1, 6]


def test_run_with_a_restart(tmp_path):
    run = make_run(tmp_path / "run", restart=True)
    page = build_report([("run", run)])
    data = embedded(page)
    restarts = next(p for p in data["panels"] if p["title"] == "restarts")
    assert restarts["series"][0]["key"] == "restarts/learner" and restarts["series"][0]["values"] == [0, 0, 1, 1]
    assert "learner group replaced in 2.5 s: rank 1 died (continued from step 2)" in page


def test_report_while_the_run_goes_reads_the_trace_files(tmp_path):
    run = make_run(tmp_path / "run")
    events = json.loads((run / "trace.json").read_text())["traceEvents"]
    (run / "trace.json").unlink()
    (run / "trace").mkdir()
    (run / "trace" / "driver.7.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"ph": "X", "na')
    data = embedded(build_report([("run", run)]))
    assert len(data["runs"][0]["timeline"]["spans"]) == 12  # the line cut short is skipped


def test_token_data_kept_for_a_bounded_number_of_steps(tmp_path):
    assert spread(list(range(10)), 3) == [0, 4, 9] and spread([1, 2], 5) == [1, 2] and spread([1, 2], 0) == []
    run = make_run(tmp_path / "run")
    data = embedded(build_report([("run", run)], max_token_steps=0))
    assert all("answers" not in row for rows in data["runs"][0]["samples"].values() for row in rows)


def test_nan_and_empty_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": math.nan, "kl_ref": 0.1}) + "\n")
    for step in (1, 2):  # no .hydra/: the newest checkpoint's config
        (run / "checkpoints" / f"step_{step:08d}").mkdir(parents=True)
        (run / "checkpoints" / f"step_{step:08d}" / "config.yaml").write_text(f"saved_at: {step}\n")
    page = build_report([("run", run)])
    assert "saved_at: 2" in page
    data = embedded(page)
    assert [p["title"] for p in data["panels"]] == ["KL"]
    assert data["runs"][0]["timeline"]["spans"] == [] and data["runs"][0]["samples"] == {}
    refresh_report(tmp_path / "missing")  # logged, never raised
    assert not (tmp_path / "missing").exists()


def test_nice_ticks():
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(3, 17, 5) == [4, 6, 8, 10, 12, 14, 16] and nice_ticks(-0.02, 0.09) == [
        -0.02,
        0.0,
        0.02,
        0.04,
        0.06,
        0.08,
    ]


class _Tokenizer:
    def batch_decode(self, ids):
        return [f"<{i[0]}>" for i in ids]


def _batch() -> TensorDict:
    """Two groups of two answers; row 1's second token has ``pi_old / mu = e`` (outside a cap of 2), row 3 is a
    tool episode whose second token is the tool's (``loss_mask`` 0)."""
    return TensorDict(
        {
            "group_id": torch.tensor([0, 0, 1, 1]),
            "prompt": NonTensorStack(*["p0", "p0", "p1", "p1"]),
            "response_text": NonTensorStack(*["a", "b", "c", "d"]),
            "response_ids": torch.tensor([[5, 6, 0], [7, 8, 9], [1, 0, 0], [2, 3, 4]]),
            "response_mask": torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]),
            "loss_mask": torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 0, 1]]),
            "behavior_logprobs": torch.tensor([[-1.0, -2.0, 0], [-1.0, -2.0, -0.5], [-0.1, 0, 0], [-1, 0, -1]]),
            "learner_logprobs": torch.tensor([[-1.0, -2.0, 0], [-1.0, -1.0, -0.5], [-0.1, 0, 0], [-1, -9, -1]]),
            "reward": torch.tensor([1.0, 0.0, 1.0, 0.0]),
            "reward_correct": torch.tensor([1.0, 0.0, 1.0, 0.0]),
            "advantage": torch.tensor([0.7071, -0.7071, 0.7071, -0.7071]),
            "truncated": torch.tensor([False, True, False, False]),
            "policy_version": torch.tensor([3, 3, 2, 2]),
        },
        batch_size=[4],
    )


def test_group_answers_token_by_token():
    detail = TokenDetail(_Tokenizer(), LossSettings(engine_correction="token_mask", tis_cap=2.0))
    first, second = group_answers(_batch(), 0, ["reward_correct"], detail)
    assert first["tokens"] == ["<5>", "<6>"] and second["tokens"] == ["<7>", "<8>", "<9>"]
    assert second["logprob"] == [-1.0, -2.0, -0.5] and second["learner_logprob"] == [-1.0, -1.0, -0.5]
    assert first["engine_outside"] == [] and second["engine_outside"] == [1]  # exp(-1 - -2) = e > 2
    assert second["reward"] == 0.0 and second["reward_correct"] == 0.0 and second["advantage"] == -0.7071
    assert second["truncated"] is True and second["policy_version"] == 3
    assert "context" not in first
    _, tool = group_answers(_batch(), 3, [], detail)
    assert tool["context"] == [[1, 2]] and tool["engine_outside"] == []  # the tool token's gap does not count


def test_group_answers_without_the_learners_logprobs():
    batch = _batch().exclude("learner_logprobs")
    (answer, _) = group_answers(batch, 1, [], TokenDetail(_Tokenizer()))
    assert "learner_logprob" not in answer and "engine_outside" not in answer


class _Logger:
    def log(self, step, metrics):
        pass

    def log_trained(self, step, batch):
        pass


def test_report_refreshed_every_n_steps(tmp_path):
    cfg = OmegaConf.structured(GRPOConfig)
    cfg.report.every, cfg.logger.num_examine = 2, 0
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    steps = StepLog(cfg, tmp_path, _Logger())  # type: ignore[arg-type]
    steps.record({"reward_mean": 0.5}, None)
    assert not (tmp_path / "report.html").exists()
    steps.record({"reward_mean": 0.5}, None)
    assert (tmp_path / "report.html").exists()


def test_a_path_that_is_no_run_ends_in_one_line(tmp_path, capsys):
    import pytest

    for bad, says in ((tmp_path / "missing", "is not a folder"), (tmp_path, "no metrics.jsonl here")):
        with pytest.raises(SystemExit) as stop:
            main([str(bad)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and says in err and "Traceback" not in err, err
