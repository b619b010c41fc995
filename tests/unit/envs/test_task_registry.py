"""The task registry: one room per ``env.dataset``, each saying its columns, system prompt and evaluation defaults;
the run's system prompt as a function of the config (never written back into it); the tools on the environment."""

from __future__ import annotations

import pytest

from grpo_rl.config.schema import DATASETS
from grpo_rl.envs.tasks import TASKS, system_prompt, task_of
from grpo_rl.envs.tasks.gsm8k.env import SYSTEM_PROMPTS
from grpo_rl.envs.tasks.ifeval.env import ANSWER_TAGS_SYSTEM_PROMPT
from grpo_rl.envs.tools.format import tool_system_prompt
from grpo_rl.envs.tools.registry import BUILTIN_TOOLS
from grpo_rl.run.preflight import validate
from tests.unit.helpers import ROOT, compose_config

CALCULATOR = ["env.tools=[{name: calculator}]", "env.max_turns=3", "env.max_prompt_tokens=480"]
FILE = [
    "env.dataset=file",
    f"env.path={ROOT / 'examples' / 'prompts.jsonl'}",
    f"reward.path={ROOT / 'examples' / 'custom_reward.py'}",
    "reward.name=contains_answer",
]


def test_every_dataset_the_config_accepts_has_a_room():
    assert list(TASKS) == list(DATASETS)
    assert all(TASKS[name].name == name for name in TASKS)


def test_an_unknown_dataset_names_the_choices():
    with pytest.raises(
        ValueError,
        match=r"env.dataset='gsm9k' is not supported; choose gsm8k, ifeval, arithmetic "
        r"or file",
    ):
        task_of("gsm9k")


@pytest.mark.parametrize(
    ("dataset", "prompt", "reference", "success", "split"),
    [
        ("gsm8k", "question", None, "correct", "test"),
        ("ifeval", "prompt", None, "prompt_strict", "train"),
        ("arithmetic", "question", None, "correct", "test"),
        ("file", "text", "answer", None, None),  # the user's columns; no defaults of its own
    ],
)
def test_columns_and_evaluation_defaults(dataset, prompt, reference, success, split):
    env = compose_config(["env.prompt_column=text", "env.ground_truth_column=answer"]).env
    task = TASKS[dataset]
    assert (task.prompt_column(env), task.reference_column(env)) == (prompt, reference)
    assert (task.success_component, task.eval_split) == (success, split)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["env.template=hash"], SYSTEM_PROMPTS["hash"]),
        (["env.template=tags"], SYSTEM_PROMPTS["tags"]),
        (["env.dataset=arithmetic"], SYSTEM_PROMPTS["hash"]),
        (["env.system_prompt=Be brief."], "Be brief."),
        (["env.dataset=ifeval"], None),
        (["env.dataset=ifeval", "reward.ifeval_answer_tags=true"], ANSWER_TAGS_SYSTEM_PROMPT),
        (FILE, None),
        ([*FILE, "env.system_prompt=Be brief."], "Be brief."),
    ],
)
def test_system_prompt_without_tools(overrides, expected):
    cfg = compose_config(overrides)
    assert system_prompt(cfg.env, cfg.reward) == expected


@pytest.mark.parametrize(
    ("overrides", "own"),
    [
        ([], SYSTEM_PROMPTS["hash"]),
        (["env.system_prompt=Be brief."], "Be brief."),
        (["env.dataset=ifeval", "reward.ifeval_answer_tags=true"], ANSWER_TAGS_SYSTEM_PROMPT),
        (["env.dataset=ifeval"], None),
        (FILE, None),
    ],
)
def test_system_prompt_with_tools_follows_the_tasks_own(overrides, own):
    cfg = compose_config([*overrides, *CALCULATOR])
    configured = cfg.env.system_prompt
    tools = tool_system_prompt([BUILTIN_TOOLS["calculator"]])
    assert system_prompt(cfg.env, cfg.reward) == (f"{own}\n\n{tools}" if own else tools)
    assert cfg.env.system_prompt == configured  # computed, not written back


def test_make_env_leaves_the_config_as_it_was(tokenizer):
    from grpo_rl.envs import make_env

    cfg = compose_config(
        [
            "env.dataset=arithmetic",
            "env.arithmetic.train_size=20",
            "env.arithmetic.test_size=10",
            "env.prompts_per_step=2",
            *CALCULATOR,
        ]
    )
    validate(cfg)
    before = str(cfg)
    env = make_env(cfg, tokenizer)
    assert str(cfg) == before and cfg.env.system_prompt is None
    assert system_prompt(cfg.env, cfg.reward) in env.reset()["prompt"][0]
    assert sorted(env.tool_use.tools) == ["calculator"] and env.tool_use.max_chars == cfg.env.tool_reply_chars


def test_an_environment_without_tools_says_so(tokenizer):
    from grpo_rl.envs import make_env

    cfg = compose_config(
        [
            "env.dataset=arithmetic",
            "env.arithmetic.train_size=20",
            "env.arithmetic.test_size=10",
            "env.prompts_per_step=2",
        ]
    )
    assert make_env(cfg, tokenizer).tool_use is None
