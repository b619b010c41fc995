"""Loading a user's reward functions, their failure handling, the file environment and the worked example."""

from __future__ import annotations

import functools
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from grpo_rl.config.schema import register_configs
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent, RewardError
from grpo_rl.envs.rewards.custom import RewardLoadError, load_reward_function, user_reward_components
from grpo_rl.envs.tasks.gsm8k.reward import correctness_reward
from grpo_rl.errors import ConfigError
from grpo_rl.run.metrics import log_reward_failures
from grpo_rl.run.preflight import validate
from tests.unit.helpers import file_env, score_answers, write_jsonl

ROOT = Path(__file__).resolve().parents[3]
CONFIG_DIR = ROOT / "config"
EXAMPLE_REWARD = ROOT / "examples" / "custom_reward.py"
EXAMPLE_PROMPTS = ROOT / "examples" / "prompts.jsonl"

REWARDS = """
import numpy as np

def exact(responses, references):
    return [float(r.strip() == str(g)) for r, g in zip(responses, references)]

def by_column(responses, references, max_words, unused=None):
    return [float(len(r.split()) <= m) for r, m in zip(responses, max_words)]

def all_columns(responses, references, **columns):
    return [float(len(columns)) for _ in responses]

def as_numpy(responses, references):
    return np.ones(len(responses), dtype=np.float32)

def raises_on_boom(responses, references):
    return [1 / 0 if r == "boom" else 1.0 for r in responses]

def drops_empty(responses, references):
    return [1.0 for r in responses if r]  # a bug: one value short when an answer is empty

def none_for_unsure(responses, references):
    return [None if r == "unsure" else 0.5 for r in responses]

def always_raises(responses, references):
    raise KeyError("ground_truth")

def one_arg(responses):
    return [0.0] * len(responses)

NOT_A_FUNCTION = 3
"""


@pytest.fixture
def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    return path


def _compose(overrides: list[str] = ()):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("grpo_gsm8k", overrides=list(overrides))


# Loading


def test_load_good_function_and_call_it(rewards_file):
    fn = load_reward_function(str(rewards_file), "exact")
    assert fn(["4", " 5 ", "x"], ["4", 5, "y"]) == [1.0, 1.0, 0.0]


def test_columns_are_filtered_by_signature(rewards_file):
    by_column = load_reward_function(str(rewards_file), "by_column")
    assert by_column.columns == ("max_words", "unused") and by_column.required_columns == ("max_words",)
    # other columns are dropped rather than passed to a function that does not take them
    assert by_column(["a b", "a b c"], [None, None], max_words=[2, 2], prompt=["p", "q"]) == [1.0, 0.0]
    all_columns = load_reward_function(str(rewards_file), "all_columns")
    assert all_columns(["a"], [None], max_words=[1], prompt=["p"]) == [2.0]
    with pytest.raises(RewardLoadError, match=r"requires column\(s\) \['max_words'\]"):
        by_column.check_columns(["prompt"])


def test_numpy_output_becomes_floats(rewards_file):
    out = load_reward_function(str(rewards_file), "as_numpy")(["a", "b"], [None, None])
    assert out == [1.0, 1.0] and all(type(v) is float for v in out)


def test_missing_file_names_the_key_and_fix(tmp_path):
    with pytest.raises(RewardLoadError, match=r"reward\.path=.*nope\.py.*does not exist; set reward\.path"):
        load_reward_function(str(tmp_path / "nope.py"), "f")
    with pytest.raises(RewardLoadError, match=r"reward\.functions\[1\]\.path="):
        load_reward_function(str(tmp_path / "nope.py"), "f", key="reward.functions[1]")


def test_missing_function_lists_what_the_file_defines(rewards_file):
    with pytest.raises(RewardLoadError, match=r"reward\.name=exakt: .* defines no 'exakt'") as info:
        load_reward_function(str(rewards_file), "exakt")
    assert "'exact'" in str(info.value) and "'raises_on_boom'" in str(info.value)


def test_not_callable_and_bad_signature(rewards_file):
    with pytest.raises(RewardLoadError, match="NOT_A_FUNCTION' in .* is a int"):
        load_reward_function(str(rewards_file), "NOT_A_FUNCTION")
    with pytest.raises(RewardLoadError, match=r"reward\.name=one_arg has signature one_arg\(responses\) in ") as info:
        load_reward_function(str(rewards_file), "one_arg")
    message = str(info.value)  # the file, and the three signatures it could have had
    assert str(rewards_file) in message and "(responses, references, **columns)" in message
    assert "compute_score(data_source, solution_str, ground_truth, extra_info=None)" in message
    assert "reward_func(prompts, completions, **kwargs)" in message


def test_file_that_fails_to_import(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import not_a_module_anywhere\n")
    with pytest.raises(RewardLoadError, match="importing the file raised ModuleNotFoundError"):
        load_reward_function(str(path), "f")


def test_file_is_imported_once(tmp_path):
    path = tmp_path / "counted.py"
    path.write_text(
        "import builtins\nbuiltins._grpo_imports = getattr(builtins, '_grpo_imports', 0) + 1\n"
        "def f(responses, references):\n    return [0.0] * len(responses)\n"
    )
    import builtins

    load_reward_function(str(path), "f")
    load_reward_function(str(path), "f")
    assert builtins._grpo_imports == 1
    del builtins._grpo_imports


def test_components_from_config(rewards_file):
    cfg = _compose(
        [
            f"reward.path={rewards_file}",
            "reward.name=exact",
            f"reward.functions=[{{path: {rewards_file}, name: as_numpy, weight: 0.5}},"
            f"{{path: {rewards_file}, name: exact, weight: 2, label: exact_again}}]",
        ]
    )
    comps = user_reward_components(cfg.reward)
    assert [(c.name, c.weight) for c in comps] == [("exact", 1.0), ("as_numpy", 0.5), ("exact_again", 2.0)]
    dup = _compose(
        [
            f"reward.path={rewards_file}",
            "reward.name=exact",
            f"reward.functions=[{{path: {rewards_file}, name: exact}}]",
        ]
    )
    with pytest.raises(RewardLoadError, match="both logged as reward_exact"):
        user_reward_components(dup.reward)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["env.dataset=file", "env.path=x.jsonl"], "env.dataset=file needs a reward: set reward.path"),
        (["reward.path=r.py"], "set both"),
        (["reward.functions=[{path: r.py}]"], r"reward.functions\[0\] needs both path and name"),
        (["reward.path=/no/such/rewards.py", "reward.name=f"], "reward.path=/no/such/rewards.py"),
        (["reward.fallback=nan"], "reward.fallback=nan must be a finite number"),
    ],
)
def test_validate_rejects_bad_reward_config(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(_compose(overrides))


# Failure handling (CompositeReward around a user's function)


def _reward(rewards_file, name: str, fallback: float = -1.0) -> CompositeReward:
    fn = load_reward_function(str(rewards_file), name)
    return CompositeReward(
        [
            RewardComponent(name, fn, 1.0),
            RewardComponent("exact", load_reward_function(str(rewards_file), "exact"), 1.0),
        ],
        fallback=fallback,
    )


def test_raising_on_some_samples_gets_the_fallback(rewards_file):
    result = _reward(rewards_file, "raises_on_boom")(["ok", "boom", "ok", "boom"], ["ok"] * 4)
    assert result.components["raises_on_boom"].tolist() == [1.0, -1.0, 1.0, -1.0]
    assert result.components["exact"].tolist() == [1.0, 0.0, 1.0, 0.0]  # other components unaffected
    assert result.failures == {"raises_on_boom": 2}
    assert [(e["index"], e["response"]) for e in result.failure_examples] == [(1, "boom"), (3, "boom")]
    assert "ZeroDivisionError" in result.failure_examples[0]["error"]


def test_wrong_count_isolates_the_bad_sample(rewards_file):
    result = _reward(rewards_file, "drops_empty", fallback=0.25)(["a", "", "b"], ["x"] * 3)
    assert result.components["drops_empty"].tolist() == [1.0, 0.25, 1.0]
    assert result.failures == {"drops_empty": 1}


def test_non_number_gets_the_fallback(rewards_file):
    result = _reward(rewards_file, "none_for_unsure")(["sure", "unsure"], ["x"] * 2)
    assert result.components["none_for_unsure"].tolist() == [0.5, -1.0]
    assert "returned None" in result.failure_examples[0]["error"]


def test_every_sample_failing_raises_naming_the_file_and_the_function(rewards_file):
    cfg = SimpleNamespace(path=str(rewards_file), name="always_raises", functions=[], timeout_seconds=None)
    reward = CompositeReward(user_reward_components(cfg))
    with pytest.raises(RewardError) as info:
        reward(["a", "b"], ["x"] * 2)
    assert str(info.value).startswith(f"reward 'always_raises' ({rewards_file}:always_raises) failed on every sample")
    # A component built without an origin finds it from its function: a built-in by its module's file.
    builtin = CompositeReward(
        [RewardComponent("correct", functools.partial(correctness_reward, last_number_fallback=False))]
    )
    with pytest.raises(
        RewardError,
        match=r"^reward 'correct' \(grpo_rl/envs/tasks/gsm8k/reward.py:"
        r"correctness_reward\) failed on every sample",
    ):
        builtin(["a", "b"], [None, None])


def test_failures_are_written_to_the_run_dir(tmp_path, rewards_file):
    result = _reward(rewards_file, "raises_on_boom")(["ok", "boom"], ["ok"] * 2)
    assert log_reward_failures(tmp_path, 7, result.failure_examples) == 1
    assert log_reward_failures(tmp_path, 8, []) == 0
    rows = [json.loads(line) for line in (tmp_path / "reward_failures.jsonl").read_text().splitlines()]
    assert rows == [{"step": 7, **result.failure_examples[0]}] and rows[0]["response"] == "boom"


# The file environment


ROWS = [
    {"prompt": "Say four.", "ground_truth": "4", "max_words": 1, "topic": "math"},
    {
        "prompt": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Say five."}],
        "ground_truth": 5,
        "max_words": 3,
        "topic": "math",
    },
]


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_file_env_passes_references_and_columns(tmp_path, tokenizer, rewards_file, suffix):
    data = tmp_path / f"prompts.{suffix}"
    if suffix == "jsonl":
        write_jsonl(data, ROWS)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        # a parquet column has one type: plain-string prompts and ground truths
        pq.write_table(
            pa.Table.from_pylist([{**r, "prompt": "Say it.", "ground_truth": str(r["ground_truth"])} for r in ROWS]),
            data,
        )
    env = file_env(tokenizer, data, rewards_file, "all_columns")
    assert env.extra_columns == ("prompt", "max_words", "topic")
    prompts, nxt = score_answers(env, ["4", "x", "5", "5"])
    assert list(prompts["reference"]) == (["4", 5] if suffix == "jsonl" else ["4", "5"])
    assert nxt["reward_all_columns"].squeeze(-1).tolist() == [3.0] * 4
    if suffix == "jsonl":  # chat messages are used as is, system turn included
        assert "Be terse." in prompts["prompt"][1] and "Say five." in prompts["prompt"][1]


def test_file_env_named_columns_and_no_ground_truth(tmp_path, tokenizer, rewards_file):
    rows = [{"question": "Say four in one word.", "limit": 1}, {"question": "Say five.", "limit": 2}]
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    env = file_env(
        tokenizer,
        data,
        rewards_file,
        "all_columns",
        ["env.prompt_column=question", "env.ground_truth_column=null", "env.extra_columns=[limit]"],
    )
    assert env.extra_columns == ("question", "limit")  # the prompt column always comes along
    prompts, nxt = score_answers(env, ["four", "four five six"])
    assert list(prompts["reference"]) == [None, None]
    assert nxt["reward_all_columns"].squeeze(-1).tolist() == [2.0, 2.0]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["env.prompt_column=question"], r"row 0 has no column env.prompt_column='question'"),
        (["env.ground_truth_column=answer"], r"env.ground_truth_column=null if your reward needs no ground truth"),
        (["env.extra_columns=[difficulty]"], r"no row has \['difficulty'\]"),
    ],
)
def test_file_env_column_errors(tmp_path, tokenizer, rewards_file, overrides, match):
    data = write_jsonl(tmp_path / "p.jsonl", ROWS)
    with pytest.raises(ConfigError, match=match):
        file_env(tokenizer, data, rewards_file, "exact", overrides)


def test_required_column_missing_from_data(tmp_path, tokenizer, rewards_file):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi", "ground_truth": "x"}])
    with pytest.raises(RewardLoadError, match=r"reward.name=by_column requires column\(s\) \['max_words'\]"):
        file_env(tokenizer, data, rewards_file, "by_column")


def test_fallback_is_configurable(tmp_path, tokenizer, rewards_file):
    data = write_jsonl(tmp_path / "p.jsonl", ROWS)
    env = file_env(tokenizer, data, rewards_file, "raises_on_boom", ["reward.fallback=-2"])
    _, nxt = score_answers(env, ["boom", "ok", "ok", "ok"])
    assert nxt["reward_raises_on_boom"].squeeze(-1).tolist() == [-2.0, 1.0, 1.0, 1.0]
    assert env.last_reward_failures == {"raises_on_boom": 1}


def test_user_function_added_to_a_builtin_task(tmp_path, tokenizer, rewards_file):
    from grpo_rl.envs import make_env

    cfg = _compose(
        ["env.dataset=ifeval", f"reward.path={rewards_file}", "reward.name=all_columns", "env.prompts_per_step=1"]
    )
    rows = [
        {
            "key": 1,
            "prompt": "Answer in lowercase.",
            "instruction_id_list": ["change_case:english_lowercase"],
            "kwargs": [{}],
        }
    ]
    env = make_env(cfg, tokenizer, records=rows)
    _, nxt = score_answers(env, ["yes", "no"] * 2)
    assert nxt["reward_all_columns"].squeeze(-1).tolist() == [1.0] * 4  # the ifeval env passes `prompt`


# The worked example in examples/ and docs/custom_tasks.md


def test_worked_example(tokenizer):
    contains_answer = load_reward_function(str(EXAMPLE_REWARD), "contains_answer")
    brevity = load_reward_function(str(EXAMPLE_REWARD), "brevity")
    assert contains_answer(
        ["It is Ottawa.", "Toronto", "16 sides", "carbon  Dioxide!"], ["Ottawa", "Ottawa", "6", "carbon dioxide"]
    ) == [1.0, 0.0, 0.0, 1.0]
    assert brevity(["one", "one two three four"], [None, None], max_words=[2, 2]) == [1.0, 0.5]
    env = file_env(tokenizer, EXAMPLE_PROMPTS, EXAMPLE_REWARD, "contains_answer")
    assert len(env) == 10
    docs = (ROOT / "docs" / "custom_tasks.md").read_text()
    assert textwrap.dedent(EXAMPLE_REWARD.read_text().split("import re\n", 1)[1]).strip() in docs
