"""Tests for the arithmetic task: seeded, disjoint, correct generated problems, scored by GSM8K's reward."""

from __future__ import annotations

import re

import pytest

from grpo_rl.envs.tasks.arithmetic.problems import ArithmeticSpec, arithmetic_records, problem_count
from grpo_rl.envs.tasks.gsm8k.reward import reference_answer
from grpo_rl.errors import ConfigError
from grpo_rl.run.preflight import validate
from tests.unit.helpers import compose_config, score_answers

SPECS = [
    ArithmeticSpec(("add",), 3, held_out=300),
    ArithmeticSpec(("add", "sub"), 2, held_out=300),
    ArithmeticSpec(("mul",), 2, 1, held_out=300),
    ArithmeticSpec(("add", "sub", "mul"), 1, 1, held_out=40),
]
_QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def _questions(records):
    return [r["question"] for r in records]


@pytest.mark.parametrize("spec", SPECS)
def test_records_are_seeded(spec):
    first = arithmetic_records("train", seed=3, size=100, spec=spec)
    assert first == arithmetic_records("train", seed=3, size=100, spec=spec)
    assert first != arithmetic_records("train", seed=4, size=100, spec=spec)
    assert arithmetic_records("test", seed=3, size=40, spec=spec) == arithmetic_records(
        "test", seed=3, size=40, spec=spec
    )


@pytest.mark.parametrize("spec", SPECS)
def test_train_and_test_are_disjoint_and_distinct(spec):
    train_size = min(1000, problem_count(spec) - spec.held_out)
    train = _questions(arithmetic_records("train", seed=0, size=train_size, spec=spec))
    test = _questions(arithmetic_records("test", seed=0, size=spec.held_out, spec=spec))
    assert len(set(train)) == len(train) == train_size and len(set(test)) == len(test) == spec.held_out
    assert not set(train) & set(test)


def test_a_smaller_test_split_is_a_prefix():
    spec = SPECS[1]
    assert (
        arithmetic_records("test", seed=0, size=50, spec=spec)
        == arithmetic_records("test", seed=0, size=300, spec=spec)[:50]
    )


@pytest.mark.parametrize("spec", SPECS)
def test_answers_are_correct(spec):
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    names = {"+": "add", "-": "sub", "*": "mul"}
    seen = set()
    for record in arithmetic_records("train", seed=1, size=min(300, problem_count(spec) - spec.held_out), spec=spec):
        a, op, b = _QUESTION.fullmatch(record["question"]).groups()
        a, b = int(a), int(b)
        seen.add(names[op])
        assert reference_answer(record["answer"]) == str(ops[op](a, b))
        assert len(str(a)) == spec.digits
        assert len(str(b)) == (spec.mul_digits if op == "*" else spec.digits)
        assert op != "-" or a >= b  # no negative results
    assert seen == set(spec.operations)


def test_impossible_sizes_and_splits_fail():
    spec = ArithmeticSpec(("add",), 1, held_out=50)  # 81 problems
    with pytest.raises(ConfigError, match="train_size"):
        arithmetic_records("train", seed=0, size=40, spec=spec)
    with pytest.raises(ConfigError, match="test_size"):
        arithmetic_records("test", seed=0, size=60, spec=spec)
    with pytest.raises(ConfigError, match="env.split"):
        arithmetic_records("validation", seed=0, size=10, spec=spec)


ARITHMETIC = [
    "env.dataset=arithmetic",
    "env.arithmetic.operations=[add]",
    "env.arithmetic.digits=2",
    "env.arithmetic.train_size=200",
    "env.arithmetic.test_size=50",
    "env.prompts_per_step=2",
    "env.shuffle=false",
]


def test_env_builds_and_scores_with_the_gsm8k_reward(tokenizer):
    from grpo_rl.envs import make_env
    from grpo_rl.envs.tasks.gsm8k.env import SYSTEM_PROMPTS

    cfg = compose_config(ARITHMETIC)
    validate(cfg)
    env = make_env(cfg, tokenizer)
    assert env.name == "arithmetic" and len(env) == 200
    spec = ArithmeticSpec(("add",), 2, held_out=50)
    train = arithmetic_records("train", seed=0, size=200, spec=spec)
    refs = [reference_answer(r["answer"]) for r in train[:2]]  # unshuffled: the first two problems
    wrong = str(int(refs[1]) + 1)
    prompts, rewards = score_answers(
        env,
        [
            f"The sum is {refs[0]}.\n#### {refs[0]}",
            f"#### {wrong}",
            f"#### {refs[1]}",
            f"So it is {wrong}.\n#### {wrong}",
        ],
    )
    assert list(prompts["reference"]) == refs
    assert train[0]["question"] in prompts["prompt"][0] and SYSTEM_PROMPTS["hash"] in prompts["prompt"][0]
    assert rewards["reward_correct"].flatten().tolist() == [1.0, 0.0, 1.0, 0.0]
    assert rewards["reward_format"].flatten().tolist() == [1.0, 1.0, 1.0, 1.0]

    test = make_env(cfg, tokenizer, split="test")
    assert len(test) == 50
    test_questions = {r["question"] for r in arithmetic_records("test", seed=0, size=50, spec=spec)}
    assert test_questions.isdisjoint(_questions(train))


def test_held_out_evaluation_uses_the_test_split():
    from grpo_rl.rollout.evaluation import eval_split, success_component

    cfg = compose_config(ARITHMETIC)
    assert eval_split(cfg) == "test" and success_component(cfg) == "correct"


@pytest.mark.parametrize("name", ["grpo_arithmetic", "grpo_arithmetic_tools"])
def test_configs_compose_and_validate(name):
    from grpo_rl.api import compose

    cfg = compose(name)
    validate(cfg)
    assert cfg.env.dataset == "arithmetic" and cfg.eval.num_prompts >= 200
    assert cfg.eval.num_prompts <= cfg.env.arithmetic.test_size
    assert bool(cfg.env.tools) == name.endswith("tools")


def test_tools_env_keeps_the_gsm8k_prompt(tokenizer):
    from grpo_rl.envs import make_env
    from grpo_rl.envs.tasks.gsm8k.env import SYSTEM_PROMPTS

    cfg = compose_config(
        [*ARITHMETIC, "env.tools=[{name: calculator}]", "env.max_turns=3", "env.max_prompt_tokens=480"]
    )
    validate(cfg)
    env = make_env(cfg, tokenizer)
    prompt = env.reset()["prompt"][0]
    assert SYSTEM_PROMPTS["hash"] in prompt and "calculator" in prompt and env.tool_use is not None


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["env.arithmetic.operations=[div]"], "env.arithmetic.operations"),
        (["env.arithmetic.operations=[]"], "env.arithmetic.operations"),
        (["env.arithmetic.operations=[add,add]"], "env.arithmetic.operations"),
        (["env.arithmetic.digits=0"], "env.arithmetic.digits"),
        (["env.arithmetic.mul_digits=10"], "env.arithmetic.mul_digits"),
        (["env.arithmetic.train_size=0"], "env.arithmetic.train_size"),
        (["env.arithmetic.test_size=-1"], "env.arithmetic.test_size"),
        (["env.arithmetic.digits=1"], "env.arithmetic.train_size"),  # 200 + 50 > 81 distinct problems
        (["env.split=validation"], "env.split"),
        (["eval.split=validation"], "eval.split"),
    ],
)
def test_validation_names_the_bad_key(overrides, key):
    cfg = compose_config([*ARITHMETIC, *overrides])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as info:
        validate(cfg)
    assert "\n" not in str(info.value)
