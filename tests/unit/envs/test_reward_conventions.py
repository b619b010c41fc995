"""Reward functions written for verl and for TRL are recognised by their parameter names and called as ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent
from grpo_rl.envs.rewards.custom import RewardLoadError, load_reward_function, user_reward_components
from tests.unit.helpers import ROOT, compose_config, file_env, score_answers, write_jsonl

REWARDS = """
calls = []

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    calls.append((data_source, solution_str, ground_truth, extra_info))
    return float(solution_str.strip() == str(ground_truth))

def verl_dict(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "nokey":
        return {"acc": 1.0}
    return {"score": 0.5 if solution_str == str(ground_truth) else 0.0, "acc": 1.0}

def verl_no_source(solution_str, ground_truth):
    return float(ground_truth in solution_str)

def verl_needs_more(data_source, solution_str, ground_truth, extra_info, scale):
    return 1.0

trl_seen = {}

def trl_exact(prompts, completions, ground_truth, **kwargs):
    trl_seen.update(prompts=prompts, completions=completions, ground_truth=ground_truth, kwargs=kwargs)
    return [float(c.strip() == str(g)) for c, g in zip(completions, ground_truth)]

def trl_conversational(prompts, completions, **kwargs):
    return [float(isinstance(c, list) and c[0]["role"] == "assistant") for c in completions]

def trl_none_when_unsure(completions, **kwargs):
    return [None if c == "unsure" else 1.0 for c in completions]

def trl_named_column(completions, solution, max_words):
    return [float(c == s) for c, s in zip(completions, solution)]

def trl_needs_state(prompts, completions, trainer_state, **kwargs):
    return [0.0] * len(completions)
"""


@pytest.fixture
def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "conventions.py"
    path.write_text(REWARDS)
    return path


# verl


def test_verl_function_is_called_once_per_answer_with_keywords(rewards_file):
    fn = load_reward_function(str(rewards_file), "compute_score")
    assert fn.convention == "verl"
    out = fn(["4", "5"], ["4", "4"], data_source=["math", "math"], extra_info=[{"i": 0}, {"i": 1}])
    assert out == [1.0, 0.0]
    module_calls = fn.fn.__globals__["calls"]
    assert module_calls == [("math", "4", "4", {"i": 0}), ("math", "5", "4", {"i": 1})]


def test_verl_without_data_source_or_extra_info_columns(rewards_file):
    fn = load_reward_function(str(rewards_file), "compute_score")
    fn(["x"], ["y"], topic=["t"])
    # no data_source column: None; no extra_info column: the row's columns as a dict
    assert fn.fn.__globals__["calls"][-1] == (None, "x", "y", {"topic": "t"})
    # a function that takes only some of verl's arguments gets only those
    assert load_reward_function(str(rewards_file), "verl_no_source")(["a 7 b", "8"], ["7", "7"]) == [1.0, 0.0]


def test_verl_dict_result_gives_its_score_and_a_dict_without_score_fails(rewards_file):
    fn = load_reward_function(str(rewards_file), "verl_dict")
    assert fn(["4", "5"], ["4", "4"]) == [0.5, 0.0]
    reward = CompositeReward([RewardComponent("verl_dict", fn)], fallback=-1.0)
    result = reward(["4", "nokey"], ["4", "4"])
    assert result.components["verl_dict"].tolist() == [0.5, -1.0]
    assert result.failures == {"verl_dict": 1} and "without a 'score' key" in result.failure_examples[0]["error"]


def test_verl_parameter_that_cannot_be_filled(rewards_file):
    with pytest.raises(
        RewardLoadError,
        match=r"reward\.name=verl_needs_more has signature .*\['scale'\] cannot be "
        r"filled.*give them defaults",
    ):
        load_reward_function(str(rewards_file), "verl_needs_more")


def test_verl_function_on_a_file_task(tmp_path, tokenizer, rewards_file):
    """It used to be taken for ours: ``ground_truth`` became a required data column, and building the environment
    failed, blaming the data ("requires column(s) ['ground_truth'] ... add them to the data")."""
    rows = [
        {"prompt": "Say four.", "ground_truth": "4", "data_source": "toy"},
        {"prompt": "Say five.", "ground_truth": "5", "data_source": "toy"},
    ]
    env = file_env(
        tokenizer, write_jsonl(tmp_path / "p.jsonl", rows), rewards_file, "compute_score", ["reward.fallback=-1"]
    )
    _, nxt = score_answers(env, ["4", "x", "5", "5"])
    assert nxt["reward_compute_score"].squeeze(-1).tolist() == [1.0, 0.0, 1.0, 1.0]


# TRL


def test_trl_function_gets_prompts_completions_and_columns(rewards_file):
    fn = load_reward_function(str(rewards_file), "trl_exact", prompt_column="prompt", reference_column="answer")
    assert fn.convention == "trl"
    out = fn(["4", "5"], ["4", "4"], prompt=["Say four.", "Say four."], topic=["a", "b"])
    assert out == [1.0, 0.0]
    seen = fn.fn.__globals__["trl_seen"]
    assert seen["prompts"] == ["Say four.", "Say four."] and seen["completions"] == ["4", "5"]
    assert seen["ground_truth"] == ["4", "4"]
    # the data columns but the prompt, and the references under the data's own column name too
    assert seen["kwargs"] == {"topic": ["a", "b"], "answer": ["4", "4"]}


def test_trl_conversational_prompts_get_message_completions(rewards_file):
    fn = load_reward_function(str(rewards_file), "trl_conversational", prompt_column="prompt")
    chat = [{"role": "user", "content": "hi"}]
    assert fn(["a", "b"], [None, None], prompt=[chat, "plain"]) == [1.0, 0.0]


def test_trl_none_is_no_reward(rewards_file):
    comps = user_reward_components(
        compose_config([f"reward.path={rewards_file}", "reward.name=trl_none_when_unsure"]).reward
    )
    reward = CompositeReward(comps, fallback=-1.0)
    result = reward(["sure", "unsure", "sure"], [None] * 3)
    assert result.components["trl_none_when_unsure"].tolist() == [1.0, -1.0, 1.0]
    assert result.failures == {"trl_none_when_unsure": 1}
    assert result.failure_examples[0]["index"] == 1 and result.failure_examples[0]["no_reward"]
    # a step in which no answer gets a reward goes on (for ours, every sample failing stops the run)
    result = reward(["unsure", "unsure"], [None] * 2)
    assert result.components["trl_none_when_unsure"].tolist() == [-1.0, -1.0]
    assert result.failures == {"trl_none_when_unsure": 2}


def test_trl_required_columns(rewards_file):
    fn = load_reward_function(str(rewards_file), "trl_named_column", reference_column="solution")
    assert fn.required_columns == ("max_words",)  # `solution` is filled by the references
    assert fn(["4", "5"], ["4", "4"], max_words=[1, 1], prompt=["p", "p"]) == [1.0, 0.0]
    with pytest.raises(RewardLoadError, match=r"requires column\(s\) \['max_words'\]"):
        fn.check_columns(["prompt"])
    with pytest.raises(RewardLoadError, match=r"TRL's \['trainer_state'\] are not available here"):
        load_reward_function(str(rewards_file), "trl_needs_state")


def test_trl_function_on_a_file_task(tmp_path, tokenizer, rewards_file):
    rows = [
        {"question": "Say four.", "solution": "4", "max_words": 1},
        {"question": "Say five.", "solution": "5", "max_words": 1},
    ]
    env = file_env(
        tokenizer,
        write_jsonl(tmp_path / "p.jsonl", rows),
        rewards_file,
        "trl_exact",
        ["env.prompt_column=question", "env.ground_truth_column=solution", "reward.fallback=-1"],
    )
    _, nxt = score_answers(env, ["4", "x", "5", "5"])
    assert nxt["reward_trl_exact"].squeeze(-1).tolist() == [1.0, 0.0, 1.0, 1.0]
    seen = load_reward_function(str(rewards_file), "trl_exact").fn.__globals__["trl_seen"]
    # one call per batch; the raw prompt column, not the chat-formatted text
    assert seen["prompts"] == ["Say four.", "Say four.", "Say five.", "Say five."]
    assert seen["kwargs"]["solution"] == ["4", "4", "5", "5"] and seen["kwargs"]["max_words"] == [1] * 4


# The examples


def test_examples(tmp_path, tokenizer):
    verl = load_reward_function(str(ROOT / "examples" / "verl_style_reward.py"), "compute_score")
    assert verl.convention == "verl" and verl(["It is Jupiter.", "Mars"], ["jupiter", "jupiter"]) == [1.0, 0.0]
    trl = load_reward_function(str(ROOT / "examples" / "trl_style_reward.py"), "brevity_reward")
    assert trl.convention == "trl"
    assert trl(["a b", "a b c d"], [None, None], max_words=[2, 2]) == [1.0, 0.5]
    reward = CompositeReward([RewardComponent("brevity", trl, none_is_no_reward=True)], fallback=0.0)
    assert reward(["a b"], [None], max_words=[None]).failures == {"brevity": 1}
    env = file_env(
        tokenizer,
        ROOT / "examples" / "prompts.jsonl",
        ROOT / "examples" / "verl_style_reward.py",
        "compute_score",
        ["reward.fallback=-1"],
    )
    assert len(env) == 10
