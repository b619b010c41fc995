"""The environments as torchrl environments: specs checked by torchrl on GSM8K, IFEval and a prompt file, rollouts
with a rollout engine as the policy, transforms, and the collector's path through the same ``reset``/``step``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs import Compose, RewardScaling, RewardSum, TransformedEnv
from torchrl.envs.utils import check_env_specs

from grpo_rl.engines.base import SamplingSpec, pack_rollouts
from grpo_rl.envs import PromptEnv, group_answers, make_env, rewards_per_answer
from grpo_rl.envs.policy import EnginePolicy
from grpo_rl.rollout.collector import Collector
from tests.unit.helpers import compose_config, file_env, write_jsonl

GSM8K_ROWS = [
    {"question": f"Tom has {i} apples and buys {i} more. How many?", "answer": f"{i} + {i}\n#### {2 * i}"}
    for i in range(1, 5)
]
IFEVAL_ROWS = [
    {
        "key": i,
        "prompt": f"Write about topic {i} in lowercase without commas.",
        "instruction_id_list": ["change_case:english_lowercase", "punctuation:no_comma"],
        "kwargs": [{}, {}],
    }
    for i in range(3)
]
FILE_ROWS = [
    {"prompt": "Say four.", "ground_truth": "4", "max_words": 1},
    {"prompt": "Say five.", "ground_truth": "5", "max_words": 3},
    {"prompt": "Say six.", "ground_truth": "6", "max_words": 2},
]
FILE_REWARDS = """
def exact_and_short(responses, references, max_words):
    return [float(r.strip() == str(g)) + 0.5 * float(len(r.split()) <= m)
            for r, g, m in zip(responses, references, max_words)]
"""
# Answers a fake engine gives every prompt: right for prompt "4"/"#### 4" in places, wrong elsewhere.
ANSWERS = ["#### 4", "4", "this is lowercase", "Not, Lower"]


@pytest.fixture(params=["gsm8k", "ifeval", "file"])
def env(request, tmp_path: Path, tokenizer) -> PromptEnv:
    """Each task's environment through ``make_env``, two prompts a step in file order, on a few rows."""
    if request.param == "file":
        rewards = tmp_path / "rewards.py"
        rewards.write_text(FILE_REWARDS)
        return file_env(tokenizer, write_jsonl(tmp_path / "p.jsonl", FILE_ROWS), rewards, "exact_and_short")
    rows = GSM8K_ROWS if request.param == "gsm8k" else IFEVAL_ROWS
    data = write_jsonl(tmp_path / f"{request.param}.jsonl", rows)
    cfg = compose_config(
        [f"env.dataset={request.param}", f"env.path={data}", "env.prompts_per_step=2", "env.shuffle=false"]
    )
    return make_env(cfg, tokenizer)


class FixedEngine:
    """A rollout engine that answers every prompt with ``answers[:n]``, optionally with the groups' rows
    interleaved (a group is its ``group_id``, not a run of rows)."""

    def __init__(self, tokenizer, answers: list[str], interleave: bool = False):
        self.tokenizer, self.answers, self.interleave = tokenizer, answers, interleave

    def generate(self, prompts, n, sampling):
        ids = [self.tokenizer.encode(a, add_special_tokens=False) for _ in prompts for a in self.answers[:n]]
        batch = pack_rollouts(
            prompts, ids, [[-1.0] * len(x) for x in ids], [False] * len(ids), n, self.tokenizer.pad_token_id
        )
        if self.interleave:
            batch = batch[torch.arange(len(ids)).view(-1, n).t().reshape(-1)]
        return batch


def direct_rewards(env: PromptEnv, prompts: TensorDict, groups: list[list[str]]) -> torch.Tensor:
    """The environment's reward called by hand on each prompt's answers: ``[P, G]``."""
    refs, extras = prompts.get("reference").tolist(), prompts.get("extra").tolist()
    g = len(groups[0])
    responses = [a for answers in groups for a in answers]
    columns = {k: [e[k] for e in extras for _ in range(g)] for k in env.extra_columns}
    return env.reward(responses, [r for r in refs for _ in range(g)], **columns).total.view(len(groups), g)


def test_check_env_specs(env):
    assert env.batch_locked and env.batch_size == torch.Size([2])
    check_env_specs(env)
    check_env_specs(env, break_when_any_done=False)  # auto-resets: the next step draws the next prompts
    check_env_specs(env, seed=3)


def test_reset_and_step_shapes(env):
    td = env.reset()
    assert td.batch_size == torch.Size([2])
    assert not td["done"].any() and not td["terminated"].any()
    td.set("response_text", group_answers(ANSWERS[:3] * 2, 3))
    out = env.step(td)
    nxt = out["next"]
    assert nxt["reward"].shape == (2, 3, 1) and nxt["reward"].dtype == torch.float32
    assert {k for k in nxt.keys() if k.startswith("reward_")} == {f"reward_{c.name}" for c in env.reward.components}
    assert nxt["done"].shape == nxt["terminated"].shape == (2, 1) and nxt["done"].all() and nxt["terminated"].all()
    assert nxt["prompt_index"].tolist() == td["prompt_index"].tolist()
    torch.testing.assert_close(nxt["reward"].squeeze(-1), direct_rewards(env, td, [ANSWERS[:3]] * 2))
    with pytest.raises(RuntimeError, match="env.batch_size"):  # batch-locked: the prompts are the batch
        env.step(td[:1])


def test_rollout_with_an_engine_policy(env, tokenizer):
    policy = EnginePolicy(
        FixedEngine(tokenizer, ANSWERS), tokenizer, group_size=4, sampling=SamplingSpec(max_new_tokens=8)
    )
    td = env.rollout(1, policy)
    assert td.batch_size == torch.Size([2, 1])
    step = td[:, 0]
    groups = step.get("response_text").tolist()
    assert groups == [ANSWERS, ANSWERS]
    assert step["generation"].batch_size == torch.Size([2, 4])  # the engine's batch, one row per answer
    assert step["generation", "group_id"].tolist() == [[0] * 4, [1] * 4]
    torch.testing.assert_close(step["next", "reward"].squeeze(-1), direct_rewards(env, step, groups))
    for comp in env.reward.components:
        assert step["next", f"reward_{comp.name}"].shape == (2, 4, 1)
    # Several steps: every step is one episode per prompt, and the auto-reset draws the stream's next prompts.
    steps = env.rollout(3, policy, break_when_any_done=False)
    assert steps.batch_size == torch.Size([2, 3]) and steps["next", "reward"].shape == (2, 3, 4, 1)
    drawn = steps["prompt_index"].t().tolist()  # [step][prompt]
    assert all(len(set(d)) == 2 for d in drawn) and drawn[1] != drawn[0]


def test_rollout_with_the_transformers_engine(tmp_path, tokenizer, tiny_model_dir):
    from grpo_rl.engines.transformers_engine import TransformersEngine

    rewards = tmp_path / "rewards.py"
    rewards.write_text(FILE_REWARDS)
    env = file_env(tokenizer, write_jsonl(tmp_path / "p.jsonl", FILE_ROWS), rewards, "exact_and_short")
    engine = TransformersEngine(str(tiny_model_dir), torch.device("cpu"))
    try:
        policy = EnginePolicy(engine, tokenizer, group_size=2, sampling=SamplingSpec(max_new_tokens=4, seed=0))
        step = env.rollout(1, policy)[:, 0]
    finally:
        engine.shutdown()
    groups = step.get("response_text").tolist()
    assert len(groups) == 2 and all(len(g) == 2 for g in groups)
    torch.testing.assert_close(step["next", "reward"].squeeze(-1), direct_rewards(env, step, groups))


def test_transforms_compose(env, tokenizer):
    policy = EnginePolicy(
        FixedEngine(tokenizer, ANSWERS), tokenizer, group_size=4, sampling=SamplingSpec(max_new_tokens=8)
    )
    raw = env.rollout(1, policy)[:, 0]
    env.load_state_dict({"epoch": 0, "position": 0, "seed": env.seed})  # the same prompts again
    scaled_env = TransformedEnv(env, Compose(RewardScaling(loc=0.5, scale=2.0), RewardSum()))
    check_env_specs(scaled_env)
    env.load_state_dict({"epoch": 0, "position": 0, "seed": env.seed})
    scaled = scaled_env.rollout(1, policy)[:, 0]
    assert scaled["prompt_index"].tolist() == raw["prompt_index"].tolist()
    expected = 0.5 + 2.0 * raw["next", "reward"]
    torch.testing.assert_close(scaled["next", "reward"], expected)
    torch.testing.assert_close(scaled["next", "episode_reward"], expected)  # one-step episodes: the return
    # the components are left as the task logs them
    for comp in env.reward.components:
        torch.testing.assert_close(scaled["next", f"reward_{comp.name}"], raw["next", f"reward_{comp.name}"])
    assert scaled_env.prompts_per_step == 2 and scaled_env.name == env.name  # attributes reach the base env


@pytest.mark.parametrize("interleave", [False, True])
def test_collector_rows_get_their_own_rewards(env, tokenizer, interleave):
    """The training path: ``reset``, the engine, ``step``, and the rewards back on the engine's rows (by
    ``group_id``, whatever the row order)."""
    collector = Collector(
        env, FixedEngine(tokenizer, ANSWERS, interleave=interleave), tokenizer, group_size=4, max_new_tokens=8
    )
    batch, _ = collector.collect(0, 0)
    assert batch.batch_size == torch.Size([8])
    refs, extras = batch.get("reference").tolist(), batch.get("extra").tolist()
    columns = {k: [e[k] for e in extras] for k in env.extra_columns}
    expected = env.reward(batch.get("response_text").tolist(), refs, **columns)
    torch.testing.assert_close(batch["reward"], expected.total)
    for name, vals in expected.components.items():
        torch.testing.assert_close(batch[f"reward_{name}"], vals)
    assert "next" not in batch.keys()


def test_group_size_is_free_per_step(env):
    """Training, greedy evaluation and pass@k sample different group sizes from one environment."""
    for g in (1, 4, 2):
        td = env.reset()
        td.set("response_text", group_answers(ANSWERS[:g] * 2, g))
        assert env.step(td)["next", "reward"].shape == (2, g, 1)


def test_prompts_per_step_resizes_the_specs(env):
    env.prompts_per_step = 1
    assert env.batch_size == torch.Size([1]) and env.reset().batch_size == torch.Size([1])
    check_env_specs(env)
    env.prompts_per_step = 3
    assert env.full_reward_spec["reward"].shape == (3, -1, 1)
    check_env_specs(env)


def test_state_dict_and_seed_move_the_prompt_stream(env):
    state = env.state_dict()
    assert state == {"epoch": 0, "position": 0, "seed": env.seed}
    first = env.reset()["prompt_index"].tolist()
    env.reset()
    env.load_state_dict({**state, "next_index": 7})  # a stream position's extra keys are ignored
    assert env.reset()["prompt_index"].tolist() == first
    env.set_seed(11)
    assert env.state_dict() == {"epoch": 0, "position": 0, "seed": 11}


def test_reward_components_added_later_get_specs(tokenizer, tmp_path):
    from grpo_rl.envs.rewards.base import RewardComponent

    rewards = tmp_path / "rewards.py"
    rewards.write_text(FILE_REWARDS)
    env = file_env(tokenizer, write_jsonl(tmp_path / "p.jsonl", FILE_ROWS), rewards, "exact_and_short")
    env.reward.components.append(RewardComponent("length", lambda responses, references, **_: [1.0] * len(responses)))
    env.reset()  # reset brings the specs up to date; update_specs() does it at once
    assert "reward_length" in env.full_reward_spec.keys()
    check_env_specs(env)


def test_rewards_per_answer_follows_group_id():
    nxt = TensorDict(
        {
            "reward": torch.tensor([[1.0, 2.0], [3.0, 4.0]]).unsqueeze(-1),
            "reward_x": torch.zeros(2, 2, 1),
            "episode_reward": torch.zeros(2, 2, 1),
        },
        [2],
    )
    assert rewards_per_answer(nxt)["reward"].tolist() == [1.0, 2.0, 3.0, 4.0]
    rows = rewards_per_answer(nxt, torch.tensor([0, 1, 0, 1]))  # prompt 0's answers are rows 0 and 2
    assert rows["reward"].tolist() == [1.0, 3.0, 2.0, 4.0] and set(rows) == {"reward", "reward_x"}
    assert group_answers(["a", "b", "c", "d"], 2, torch.tensor([0, 1, 0, 1])).tolist() == [["a", "c"], ["b", "d"]]
    with pytest.raises(ValueError, match="groups of 3"):
        group_answers(["a", "b", "c", "d"], 3)
    with pytest.raises(ValueError, match="2 answers"):
        group_answers(["a", "b", "c", "d"], 2, torch.tensor([0, 0, 0, 1]))
