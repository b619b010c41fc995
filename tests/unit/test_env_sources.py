"""Where a task's prompts come from: ``env.path`` as a list of files, and enough prompts for a step."""
from __future__ import annotations


import pytest

from grpo_rl.config import ConfigError, validate
from grpo_rl.envs import make_env
from tests.unit.helpers import ROOT, compose_config, write_jsonl

REWARD = ROOT / "examples" / "custom_reward.py"


def _file_cfg(path_override: str, *extra: str):
    cfg = compose_config(["env.dataset=file", path_override, f"reward.path={REWARD}",
                          "reward.name=contains_answer", "env.shuffle=false", *extra])
    validate(cfg)
    return cfg


def _rows(prefix: str, n: int) -> list[dict]:
    return [{"prompt": f"Say {prefix}{i}.", "ground_truth": f"{prefix}{i}"} for i in range(n)]


def test_path_list_concatenates_files_in_order(tmp_path, tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", _rows("a", 2))
    b = write_jsonl(tmp_path / "b.jsonl", _rows("b", 1))
    env = make_env(_file_cfg(f"env.path=[{b},{a}]", "env.prompts_per_step=3"), tokenizer)
    assert len(env) == 3 and env.name == f"file:{b},{a}"
    assert list(env.reset()["reference"]) == ["b0", "a0", "a1"]


def test_row_errors_name_the_file_of_a_list(tmp_path, tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", _rows("a", 2))
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "", "ground_truth": "x"}])
    with pytest.raises(ValueError, match=rf"env\.path={b}: row 0 column 'prompt' is ''"):
        make_env(_file_cfg(f"env.path=[{a},{b}]", "env.prompts_per_step=1"), tokenizer)


@pytest.mark.parametrize(("override", "match"), [
    ("env.path=[]", r"env\.dataset=file needs env\.path"),
    ("env.path=[a.jsonl,'']", r"'' is not a file path"),
    ("env.path=[a.jsonl,[b.jsonl]]", r"\['b.jsonl'\] is not a file path"),
    ("env.path={a: b}", r"must be a file or folder path, or a list of files"),
])
def test_bad_path_values(override, match):
    with pytest.raises(ConfigError, match=match):
        _file_cfg(override)


def test_more_prompts_per_step_than_prompts_is_an_error(tmp_path, tokenizer):
    data = write_jsonl(tmp_path / "a.jsonl", _rows("a", 3))
    with pytest.raises(ConfigError) as info:
        make_env(_file_cfg(f"env.path={data}", "env.prompts_per_step=5"), tokenizer)
    message = str(info.value)
    assert "env.prompts_per_step=5 is more than the 3 prompts" in message
    assert "set env.prompts_per_step to at most 3" in message
    env = make_env(_file_cfg(f"env.path={data}", "env.prompts_per_step=3"), tokenizer)
    assert sorted(env.reset()["reference"]) == ["a0", "a1", "a2"]  # exactly as many is fine: no repeats


def test_skipped_prompts_are_counted_in_the_message(tmp_path, tokenizer):
    rows = _rows("a", 2) + [{"prompt": "word " * 400, "ground_truth": "x"}]
    data = write_jsonl(tmp_path / "a.jsonl", rows)
    with pytest.raises(ConfigError, match=r"more than the 2 prompts in .*\(1 more were skipped as longer than "
                                          r"env\.max_prompt_tokens=320\)"):
        make_env(_file_cfg(f"env.path={data}", "env.prompts_per_step=3"), tokenizer)


def test_held_out_prompts_may_be_fewer(tmp_path, tokenizer):
    """Evaluation asks for eval.num_prompts and serves each of a smaller split once."""
    data = write_jsonl(tmp_path / "a.jsonl", _rows("a", 3))
    env = make_env(_file_cfg(f"env.path={data}", "env.prompts_per_step=8"), tokenizer, fewer_prompts_ok=True)
    assert env.prompts_per_step == 3 and list(env.reset()["reference"]) == ["a0", "a1", "a2"]
