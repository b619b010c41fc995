"""reward.scale / reward.bias (applied to the weighted sum, logged unscaled too) and the thinking component of the
tags template (reward.thinking_weight, reward.min_thinking_tokens)."""

from __future__ import annotations

import pytest
import torch

from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent
from grpo_rl.envs.tasks.gsm8k.reward import thinking_reward
from grpo_rl.errors import ConfigError
from grpo_rl.run.preflight import validate
from tests.unit.helpers import compose_config, score_answers

ARITHMETIC = [
    "env.dataset=arithmetic",
    "env.arithmetic.operations=[add]",
    "env.arithmetic.digits=2",
    "env.arithmetic.train_size=200",
    "env.arithmetic.test_size=50",
    "env.prompts_per_step=1",
    "env.shuffle=false",
]


def exact(responses, references):
    return [float(r == ref) for r, ref in zip(responses, references, strict=True)]


def test_scale_and_bias_apply_to_the_weighted_sum():
    length = RewardComponent("len", lambda responses, _: [len(r) for r in responses], 0.5)
    reward = CompositeReward([RewardComponent("exact", exact, 2.0), length], scale=3.0, bias=-1.0)
    out = reward(["4", "no"], ["4", "4"])
    # weighted sums: 2*1 + 0.5*1 = 2.5 and 2*0 + 0.5*2 = 1.0; then (sum - 1) * 3
    torch.testing.assert_close(out.unscaled, torch.tensor([2.5, 1.0]))
    torch.testing.assert_close(out.total, torch.tensor([4.5, 0.0]))
    torch.testing.assert_close(out.components["exact"], torch.tensor([1.0, 0.0]))  # components stay unweighted


def test_identity_scale_keeps_no_unscaled_copy():
    out = CompositeReward([RewardComponent("exact", exact)])(["4"], ["4"])
    assert out.unscaled is None and out.total.tolist() == [1.0]


def test_env_writes_the_scaled_reward_and_the_unscaled_sum(tokenizer):
    from grpo_rl.envs import make_env

    cfg = compose_config([*ARITHMETIC, "reward.scale=2", "reward.bias=0.5"])
    validate(cfg)
    env = make_env(cfg, tokenizer)
    ref = make_env(cfg, tokenizer).reset()["reference"][0]  # a copy's first prompt: score_answers resets env
    _, rewards = score_answers(env, [f"#### {ref}", "no answer"])
    # correct 1 + 0.5 * format 1 = 1.5 -> (1.5 + 0.5) * 2; nothing -> 0 -> (0 + 0.5) * 2
    assert rewards["reward_unscaled"].flatten().tolist() == [1.5, 0.0]
    assert rewards["reward"].flatten().tolist() == [4.0, 1.0]
    assert "reward_unscaled" in env.full_reward_spec.keys()


def count_words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>one two three</think><answer>5</answer>", 1.0),  # three words: enough
        ("<think>one two</think><answer>5</answer>", 0.0),  # too short
        ("<think>   </think><answer>5</answer>", 0.0),  # empty
        ("<answer>5</answer>", 0.0),  # no think section
        ("<think>one two three", 0.0),  # never closed
        ("<think>one</think><think>two three</think>", 0.0),  # padded out in pieces
    ],
)
def test_thinking_reward_hand_cases(response, expected):
    assert thinking_reward([response], [None], count_tokens=count_words, min_tokens=3) == [expected]


def test_thinking_component_counts_policy_tokens(tokenizer):
    from grpo_rl.envs import make_env

    cfg = compose_config(
        [*ARITHMETIC, "env.template=tags", "reward.thinking_weight=0.25", "reward.min_thinking_tokens=5"]
    )
    validate(cfg)
    env = make_env(cfg, tokenizer)
    ref = make_env(cfg, tokenizer).reset()["reference"][0]  # a copy's first prompt: score_answers resets env
    long_thought = "I add the two numbers column by column."
    assert len(tokenizer.encode(long_thought, add_special_tokens=False)) >= 5
    assert len(tokenizer.encode("Easy.", add_special_tokens=False)) < 5
    _, rewards = score_answers(
        env, [f"<think>{long_thought}</think><answer>{ref}</answer>", f"<think>Easy.</think><answer>{ref}</answer>"]
    )
    assert rewards["reward_thinking"].flatten().tolist() == [1.0, 0.0]
    # correct 1 + 0.5 * format 1 + 0.25 * thinking
    assert rewards["reward"].flatten().tolist() == [1.75, 1.5]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["reward.thinking_weight=0.5"], "env.template=tags"),  # hash template
        (["env.dataset=ifeval", "env.template=tags", "reward.thinking_weight=0.5"], "gsm8k or arithmetic"),
        (["reward.scale=0"], "reward.scale=0 must be > 0"),
        (["reward.scale=-1"], "reward.scale=-1 must be > 0"),
        (["reward.bias=nan"], "reward.bias=nan must be a finite number"),
        (["reward.min_thinking_tokens=-1"], "reward.min_thinking_tokens=-1"),
    ],
)
def test_bad_values_are_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose_config(overrides))
