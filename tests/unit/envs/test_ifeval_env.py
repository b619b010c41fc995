"""IFEval reward components (hand-computed), answer tags, and the IFEval environment built from the config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from tensordict import TensorDict

from grpo_rl.config.schema import register_configs
from grpo_rl.envs.data import data_dir
from grpo_rl.envs.rewards.base import CompositeReward
from grpo_rl.envs.tasks.ifeval.reward import (
    IFEvalScorer,
    answer_tag_format_reward,
    answer_tag_text,
    ifeval_components,
)
from grpo_rl.errors import ConfigError
from grpo_rl.run.preflight import validate

CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"
LOWER_NO_COMMA = {
    "instruction_id_list": ["change_case:english_lowercase", "punctuation:no_comma"],
    "kwargs": [{}, {}],
    "prompt": "Reply in lowercase without commas.",
}


def _compose(name: str = "grpo_ifeval", overrides: list[str] = ()):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(name, overrides=list(overrides))


def _scores(responses, answer_tags=False):
    scorer = IFEvalScorer(answer_tags=answer_tags)
    refs = [LOWER_NO_COMMA] * len(responses)
    return {
        name: scorer.score(responses, refs, name=name)
        for name in ("prompt_strict", "prompt_loose", "inst_strict", "inst_loose")
    }


def test_components_hand_computed():
    responses = [
        "Sure:\nhello world all lowercase",  # "Sure" breaks lowercase strictly; loose drops the first line
        "hello world, all lowercase",  # the comma is in every loose variant
        "hello world all lowercase",  # both followed
    ]
    assert _scores(responses) == {
        "prompt_strict": [0.0, 0.0, 1.0],
        "prompt_loose": [1.0, 0.0, 1.0],
        "inst_strict": [0.5, 0.5, 1.0],
        "inst_loose": [1.0, 0.5, 1.0],
    }


def test_weighted_total_and_every_component_logged():
    reward = CompositeReward(ifeval_components({"prompt_strict": 1.0, "inst_loose": 0.5}))
    result = reward(
        ["Sure:\nhello world all lowercase", "hello world, all lowercase", "hello world all lowercase"],
        [LOWER_NO_COMMA] * 3,
    )
    assert set(result.components) == {"prompt_strict", "prompt_loose", "inst_strict", "inst_loose"}
    # 1.0 * prompt_strict + 0.5 * inst_loose
    torch.testing.assert_close(result.total, torch.tensor([0.5, 0.25, 1.5]))
    assert result.failures == {}


def test_scorer_runs_the_checkers_once_per_batch(monkeypatch):
    import grpo_rl.envs.tasks.ifeval.reward as mod

    calls = []
    real = mod.evaluate_response
    monkeypatch.setattr(mod, "evaluate_response", lambda *a: calls.append(a) or real(*a))
    CompositeReward(ifeval_components({"inst_strict": 1.0}))(["a", "b"], [LOWER_NO_COMMA] * 2)
    assert len(calls) == 2  # four components, one evaluation per response


def test_unknown_component_raises():
    with pytest.raises(ValueError, match="inst_strcit"):
        ifeval_components({"inst_strcit": 1.0})


@pytest.mark.parametrize(
    "response, text, fmt",
    [
        ("plan: USE CAPS, commas\n<answer>hello world</answer>", "hello world", 1.0),
        ("<answer> hello world </answer>\n", "hello world", 1.0),
        ("<answer>A, B</answer> then <answer>hello</answer>", "hello", 0.5),  # two answers: the last is checked
        ("<answer>hello</answer> and more", "hello", 0.5),  # text after the answer
        ("<answer>   </answer>", "", 0.0),
        ("<answer>hello", None, 0.0),
        ("hello world", None, 0.0),
    ],
)
def test_answer_tags(response, text, fmt):
    assert answer_tag_text(response) == text
    assert answer_tag_format_reward([response], [None]) == [fmt]


def test_answer_tags_check_only_the_answer():
    responses = [
        "I will write in lowercase, no commas.\n<answer>hello world all lowercase</answer>",
        "hello world all lowercase",
    ]  # followed, but no answer tags: nothing is checked
    assert _scores(responses, answer_tags=True)["inst_strict"] == [1.0, 0.0]
    assert _scores(responses, answer_tags=False)["inst_strict"] == [0.0, 1.0]  # "I" and a comma
    components = ifeval_components({"inst_strict": 1.0}, answer_tags=True, format_weight=0.5)
    result = CompositeReward(components)(responses, [LOWER_NO_COMMA] * 2)
    assert result.components["format"].tolist() == [1.0, 0.0]
    torch.testing.assert_close(result.total, torch.tensor([1.5, 0.0]))


def test_format_component_only_with_answer_tags():
    assert "format" not in [c.name for c in ifeval_components({"inst_strict": 1}, format_weight=0.5)]
    assert "format" not in [c.name for c in ifeval_components({"inst_strict": 1}, answer_tags=True, format_weight=0)]


def test_config_validation():
    validate(_compose())
    with pytest.raises(ConfigError, match="every reward.ifeval_weights entry is 0"):
        validate(_compose(overrides=["reward.ifeval_weights.inst_strict=0"]))
    with pytest.raises(ConfigError, match="reward.ifeval_weights.inst_loose=-1"):
        validate(_compose(overrides=["reward.ifeval_weights.inst_loose=-1"]))
    with pytest.raises(ConfigError, match="unknown key"):
        validate(_compose(overrides=["+reward.ifeval_weights.inst_lose=1"]))


def _records(n: int = 3) -> list[dict]:
    return [
        {
            "key": i,
            "prompt": f"Write about topic {i} in lowercase without commas.",
            "instruction_id_list": LOWER_NO_COMMA["instruction_id_list"],
            "kwargs": [{}, {}],
        }
        for i in range(n)
    ]


def _step(env, responses_per_prompt: list[list[str]]):
    """What the collector does: reset, attach each prompt's G answers (``[P, G]``), step; the rewards come back
    one row per answer."""
    from grpo_rl.envs import group_answers, rewards_per_answer

    prompts = env.reset()
    g = len(responses_per_prompt[0])
    answers = group_answers([r for group in responses_per_prompt for r in group], g)
    nxt = rewards_per_answer(env.step(prompts.clone(False).set("response_text", answers))["next"])
    return prompts, TensorDict({k: v.unsqueeze(-1) for k, v in nxt.items()}, [len(responses_per_prompt) * g])


def test_env_references_and_rewards(tokenizer):
    from grpo_rl.envs import make_env

    cfg = _compose(overrides=["env.prompts_per_step=2"])
    env = make_env(cfg, tokenizer, records=_records())
    prompts, nxt = _step(
        env,
        [
            ["this is a short reply in english", "This is a short reply, in English"],
            ["another reply that is all lowercase", "another reply, all lowercase"],
        ],
    )
    ref = prompts["reference"][0]
    assert set(ref) == {"instruction_id_list", "kwargs", "prompt"}
    assert ref["instruction_id_list"] == LOWER_NO_COMMA["instruction_id_list"]
    assert nxt["reward_inst_strict"].squeeze(-1).tolist() == [1.0, 0.0, 1.0, 0.5]
    assert nxt["reward_prompt_strict"].squeeze(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert nxt["reward"].squeeze(-1).tolist() == [1.0, 0.0, 1.0, 0.5]  # inst_strict weight 1, others 0
    assert list(prompts["extra"])[0] == {"prompt": ref["prompt"]}  # the raw prompt reaches every reward


def test_env_ignores_gsm8k_template_and_applies_answer_tags(tokenizer):
    from grpo_rl.envs import make_env

    plain = make_env(
        _compose("grpo_gsm8k", ["env.dataset=ifeval", "env.template=tags", "env.prompts_per_step=3"]),
        tokenizer,
        records=_records(),
    )
    text = plain.reset()["prompt"][0]
    assert "####" not in text and "<answer>" not in text and "Write about topic" in text
    tagged = make_env(
        _compose(overrides=["reward.ifeval_answer_tags=true", "env.prompts_per_step=3"]), tokenizer, records=_records()
    )
    assert "<answer>" in tagged.reset()["prompt"][0]
    assert "format" in [c.name for c in tagged.reward.components]


needs_data = pytest.mark.skipif(
    data_dir() is None or not (data_dir() / "ifeval" / "input_data.jsonl").is_file(),
    reason="IFEval prompts not found under ../shared/data (or GRPO_DATA_DIR)",
)


@needs_data
@pytest.mark.parametrize(
    "name, overrides, max_skipped",
    [
        ("grpo_ifeval", [], 0),
        ("grpo_gsm8k", ["env.dataset=ifeval"], 1),  # GSM8K's max_prompt_tokens=320 drops only the longest prompt
    ],
)
def test_make_env_over_the_real_prompts(tokenizer, name, overrides, max_skipped):
    from grpo_rl.envs import make_env

    cfg = _compose(name, overrides)
    validate(cfg)
    env = make_env(cfg, tokenizer)
    assert env.num_skipped <= max_skipped and len(env) + env.num_skipped == 541
    _, nxt = _step(env, [["a"] * 2] * cfg.env.prompts_per_step)
    assert {"reward", "reward_prompt_strict", "reward_inst_loose"} <= set(nxt.keys())
