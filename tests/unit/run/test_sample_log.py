"""The examined samples (several groups, file and console) and the wandb run name and tags."""

from __future__ import annotations

import json
import logging
import sys
import types

import torch
from tensordict import NonTensorStack, TensorDict

from grpo_rl.run.metrics import RunLogger, read_jsonl
from grpo_rl.run.sample_log import examine_rows, last_turn, sample_line

CHATML = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def _batch(groups: int = 4, group_size: int = 2) -> TensorDict:
    """``groups`` prompts with ``group_size`` answers each; answer ``j`` of group ``g`` is ``"g{g}a{j}"``."""
    n = groups * group_size
    group_id = torch.arange(groups).repeat_interleave(group_size)
    return TensorDict(
        {
            "group_id": group_id,
            "group_index": 40 + group_id.flip(0),  # the stream's groups, here as if they arrived last first
            "prompt": NonTensorStack(
                *[f"<|im_start|>user\nQuestion {g}?<|im_end|>\n<|im_start|>assistant\n" for g in group_id.tolist()]
            ),
            "response_text": NonTensorStack(*[f"g{g}a{i % group_size}" for i, g in enumerate(group_id.tolist())]),
            "reference": NonTensorStack(*[str(g) for g in group_id.tolist()]),
            "reward": torch.arange(n, dtype=torch.float32),
            "reward_correct": torch.ones(n),
            "advantage": torch.linspace(-1, 1, n),
        },
        batch_size=[n],
    )


def test_examine_rows_spreads_over_groups():
    group_id = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    assert examine_rows(group_id, 10, 2) == [0, 8]  # first and last group
    assert examine_rows(group_id, 10, 3) == [0, 4, 8]
    assert examine_rows(group_id, 10, 1) == [0]
    assert examine_rows(group_id, 10, 9) == [0, 2, 4, 6, 8]  # at most one answer per group
    assert examine_rows(group_id, 10, 0) == []
    assert examine_rows(torch.tensor([7, 7, 3, 3]), 4, 2) == [0, 2]  # groups in batch order, any ids
    assert examine_rows(None, 3, 2) == [0, 2]  # no groups: every row is its own


def test_last_turn_drops_the_template():
    assert last_turn(CHATML) == "What is 2 + 2?"
    llama3 = (
        "<|start_header_id|>user<|end_header_id|>\n\nName a planet.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert last_turn(llama3) == "Name a planet."
    assert last_turn("plain prompt") == "plain prompt"


def test_sample_line_is_compact():
    record = {
        "step": 1,
        "prompt": CHATML,
        "response": "The answer\nis " + "4 " * 200,
        "reward": 1.5,
        "reward_correct": 1.0,
        "reward_format": 0.5,
        "group": 3,
        "reference": "4",
        "advantage": 0.71,
    }
    line = sample_line(record)
    assert "\n" not in line and len(line) < 300
    assert line.startswith("group 3 | prompt: What is 2 + 2? | answer: The answer is 4 4")
    assert "| ref: 4 | reward 1.5 (correct 1, format 0.5) | adv +0.71" in line


def test_log_samples_writes_and_prints_one_answer_per_group(tmp_path, caplog):
    logger = RunLogger(tmp_path, backend="none")
    with caplog.at_level(logging.INFO, logger="grpo_rl.run.metrics"):
        logger.log_samples(5, _batch(), 2, ["reward_correct"])
    logger.close()
    rows = read_jsonl(tmp_path / "samples.jsonl")
    assert [r["response"] for r in rows] == ["g0a0", "g3a0"]
    # the fields written before, then the new ones
    assert list(rows[0]) == [
        "step",
        "prompt",
        "response",
        "reward",
        "reward_correct",
        "group",
        "group_index",
        "reference",
        "advantage",
    ]
    assert rows[1]["step"] == 5 and rows[1]["reward"] == 6.0 and rows[1]["group"] == 3
    assert [r["group_index"] for r in rows] == [43, 40]
    assert rows[1]["reference"] == "3" and abs(rows[1]["advantage"] - (-1 + 2 * 6 / 7)) < 1e-6
    printed = caplog.text
    assert "samples at step 5 (first answer of 2 of 4 groups)" in printed
    assert "group 0 | prompt: Question 0? | answer: g0a0 | ref: 0 | reward 0 (correct 1) | adv -1.00" in printed
    assert "group 3 | prompt: Question 3? | answer: g3a0" in printed


def test_log_samples_without_groups_or_advantages(tmp_path):
    """A batch with only the fields the file always had (a filtered or hand-made batch) still logs."""
    batch = TensorDict(
        {
            "prompt": NonTensorStack("p0", "p1", "p2"),
            "response_text": NonTensorStack("a", "b", "c"),
            "reward": torch.tensor([1.0, 0.0, 1.0]),
        },
        batch_size=[3],
    )
    logger = RunLogger(tmp_path, backend="none")
    logger.log_samples(1, batch, 2, [])
    logger.close()
    assert read_jsonl(tmp_path / "samples.jsonl") == [
        {"step": 1, "prompt": "p0", "response": "a", "reward": 1.0},
        {"step": 1, "prompt": "p2", "response": "c", "reward": 1.0},
    ]


class _FakeRun:
    def __init__(self):
        self.logged = []

    def log(self, record, step=None):
        self.logged.append((record, step))

    def finish(self):
        pass


def _fake_wandb(monkeypatch) -> list[dict]:
    inits: list[dict] = []
    module = types.ModuleType("wandb")

    def init(**kwargs):
        inits.append(kwargs)
        return _FakeRun()

    module.init = init
    module.Table = lambda columns, data: {"columns": columns, "data": data}
    monkeypatch.setitem(sys.modules, "wandb", module)
    return inits


def test_wandb_run_name_and_tags(tmp_path, monkeypatch):
    inits = _fake_wandb(monkeypatch)
    RunLogger(tmp_path / "run_a", backend="wandb").close()
    RunLogger(tmp_path / "run_b", backend="wandb", run_name="lr-sweep-1", tags=["gsm8k", "lora"]).close()
    assert (inits[0]["name"], inits[0]["tags"]) == ("run_a", None)  # defaults: the folder's name, no tags
    assert (inits[1]["name"], inits[1]["tags"]) == ("lr-sweep-1", ["gsm8k", "lora"])


def test_wandb_settings_come_from_the_config(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from grpo_rl.config.schema import GRPOConfig

    inits = _fake_wandb(monkeypatch)
    cfg = OmegaConf.structured(GRPOConfig)
    cfg.logger.run_name = "baseline"
    cfg.logger.tags = ["a", "b"]
    logger = RunLogger.from_config(cfg, tmp_path)
    logger.log_samples(1, _batch(groups=2), 2, ["reward_correct"])  # the table holds the new fields too
    [(record, step)] = logger._wandb.logged
    logger.close()
    assert inits[0]["name"] == "baseline" and inits[0]["tags"] == ["a", "b"] and type(inits[0]["tags"]) is list
    assert step == 1 and record["samples"]["columns"][-4:] == ["group", "group_index", "reference", "advantage"]
    assert json.dumps(record["samples"]["data"])  # plain values only


def test_a_multi_turn_sample_shows_the_whole_episode():
    from grpo_rl.run.sample_log import sample_record

    batch = _batch(groups=1, group_size=2)
    assert "episode" not in sample_record(3, batch, 0, ["reward_correct"])
    episodes = ['<tool_call>{"name": "calculator"}</tool_call><|im_start|>tool\n4<|im_end|>\n#### 4', "#### 5"]
    batch.set("episode_text", NonTensorStack(*episodes))
    row = sample_record(3, batch, 0, ["reward_correct"])
    assert row["episode"] == episodes[0] and row["response"] == "g0a0"
