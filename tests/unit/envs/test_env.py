"""Tests for grpo_rl.envs: PromptEnv's reset/step contract and prompt stream, and GSM8K over the real data."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.envs.base import PromptEnv, PromptTooLongError, group_answers
from grpo_rl.envs.data import data_dir
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent

RECORDS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "topic": f"t{i}"} for i in range(10)]


def exact(responses, references, **_):
    """1 for the reference answer; ignores extra columns (every component receives them)."""
    return [float(r.strip() == ref) for r, ref in zip(responses, references, strict=True)]


def topic_bonus(responses, references, *, topic):
    return [0.5 if t == "t3" else 0.0 for t in topic]


def make_env(tokenizer, records=RECORDS, **kw) -> PromptEnv:
    kw.setdefault("prompts_per_step", 3)
    kw.setdefault("max_prompt_tokens", 512)
    return PromptEnv(
        records,
        tokenizer,
        CompositeReward([RewardComponent("exact", exact, 1.0)]),
        format_messages=lambda row: [{"role": "user", "content": row["question"]}],
        reference_of=lambda row: row["answer"],
        **kw,
    )


def stream(env: PromptEnv, resets: int) -> list[int]:
    return [i for _ in range(resets) for i in env.reset()["prompt_index"].tolist()]


def answers_td(prompts: TensorDict, responses: list[str], group_size: int) -> TensorDict:
    """What the collector hands to ``step``: the reset's prompts with their ``G`` answers each, ``[P, G]``."""
    return prompts.clone(False).set("response_text", group_answers(responses, group_size))


def test_reset_contract(tokenizer):
    env = make_env(tokenizer, shuffle=False)
    td = env.reset()
    assert td.batch_size == torch.Size([3])
    assert {"prompt", "prompt_tokens", "reference", "prompt_index", "extra", "done"} <= set(td.keys())
    assert td["prompt_index"].tolist() == [0, 1, 2]
    assert list(td["reference"]) == ["0", "2", "4"]
    assert td["done"].shape == (3, 1) and not td["done"].any()
    prompts, tokens = list(td["prompt"]), list(td["prompt_tokens"])
    for i, (text, toks) in enumerate(zip(prompts, tokens, strict=True)):
        # the chat template was applied, with the generation prompt, and the tokens are that text
        assert RECORDS[i]["question"] in text
        assert text.endswith("<|im_start|>assistant\n")
        assert tokenizer.decode(toks) == text
        assert toks == tokenizer.encode(text, add_special_tokens=False)


def test_step_contract(tokenizer):
    env = make_env(tokenizer, shuffle=False, prompts_per_step=2)
    prompts = env.reset()  # references "0", "2"
    td = env.step(answers_td(prompts, ["0", "1", " 2 ", "x"], group_size=2))
    assert td.batch_size == torch.Size([2])  # the prompts; the answers are the action's second dimension
    assert td["next", "reward"].shape == (2, 2, 1)
    assert td["next", "reward"].flatten().tolist() == [1.0, 0.0, 1.0, 0.0]
    assert td["next", "reward_exact"].flatten().tolist() == [1.0, 0.0, 1.0, 0.0]
    assert td["next", "done"].shape == (2, 1) and td["next", "done"].all()
    assert env.last_reward_failures == {}


def test_extra_columns_reach_the_reward(tokenizer):
    env = PromptEnv(
        RECORDS,
        tokenizer,
        CompositeReward([RewardComponent("exact", exact), RewardComponent("bonus", topic_bonus, 2.0)]),
        format_messages=lambda row: [{"role": "user", "content": row["question"]}],
        reference_of=lambda row: row["answer"],
        prompts_per_step=2,
        max_prompt_tokens=512,
        shuffle=False,
        extra_columns=("topic",),
    )
    env.reset()  # rows 0, 1
    prompts = env.reset()  # rows 2, 3
    assert [e["topic"] for e in prompts["extra"]] == ["t2", "t3"]
    td = env.step(answers_td(prompts, ["4", "5", "6", "6"], group_size=2))
    assert td["next", "reward_bonus"].flatten().tolist() == [0.0, 0.0, 0.5, 0.5]
    assert td["next", "reward"].flatten().tolist() == [1.0, 0.0, 2 * 0.5 + 1.0, 2 * 0.5 + 1.0]


def test_order_is_deterministic_for_a_seed(tokenizer):
    a = stream(make_env(tokenizer, seed=7), 3)
    b = stream(make_env(tokenizer, seed=7), 3)
    c = stream(make_env(tokenizer, seed=8), 3)
    assert a == b
    assert a != c
    assert a != list(range(9))  # shuffled


def test_epochs_cover_the_data_and_reshuffle(tokenizer):
    env = make_env(tokenizer, seed=0, prompts_per_step=4)  # 10 rows: epoch 0 ends inside the third reset
    seen = stream(env, 5)  # 20 prompts = 2 epochs
    first, second = seen[:10], seen[10:]
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    assert first != second
    assert env.epoch == 1 and env.position == 10


def test_no_shuffle_is_data_order(tokenizer):
    assert stream(make_env(tokenizer, shuffle=False, prompts_per_step=4), 3) == list(range(10)) + [0, 1]


def test_state_dict_resumes_the_same_stream(tokenizer):
    a = make_env(tokenizer, seed=3)
    stream(a, 4)  # 12 prompts: into the second epoch
    state = a.state_dict()
    expected = stream(a, 5)
    b = make_env(tokenizer, seed=99)  # the seed comes from the state
    b.load_state_dict(state)
    assert stream(b, 5) == expected


def _long_records():
    records = [dict(r) for r in RECORDS[:4]]
    records[2]["question"] = "Please add these numbers: " + " + ".join(str(i) for i in range(200))
    return records


def test_too_long_prompts_skipped(tokenizer):
    env = make_env(tokenizer, _long_records(), max_prompt_tokens=64, prompts_per_step=4)
    assert len(env) == 3 and env.num_skipped == 1
    assert 2 not in stream(env, 3)


def test_too_long_prompts_error_names_row_and_fix(tokenizer):
    with pytest.raises(PromptTooLongError, match="row 2") as info:
        make_env(tokenizer, _long_records(), max_prompt_tokens=64, too_long="error")
    assert "env.max_prompt_tokens=64" in str(info.value)
    assert "env.too_long_prompts=skip" in str(info.value)


def test_every_prompt_too_long_raises(tokenizer):
    with pytest.raises(PromptTooLongError, match="every prompt"):
        make_env(tokenizer, max_prompt_tokens=3)


def test_empty_records_raise(tokenizer):
    with pytest.raises(ValueError, match="empty"):
        make_env(tokenizer, [])


_DATA = data_dir()
needs_gsm8k = pytest.mark.skipif(
    _DATA is None or not (_DATA / "gsm8k" / "test.jsonl").is_file(),
    reason="GSM8K data not found (set GRPO_DATA_DIR or provide ../shared/data)",
)


@needs_gsm8k
def test_gsm8k_env_on_real_data(tokenizer):
    from grpo_rl.envs import make_env
    from grpo_rl.envs.data import load_records
    from grpo_rl.envs.tasks.gsm8k.env import SYSTEM_PROMPTS
    from grpo_rl.envs.tasks.gsm8k.reward import reference_answer

    records = load_records("gsm8k", split="test", path=str(_DATA / "gsm8k"))
    assert len(records) == 1319
    cfg = OmegaConf.structured(GRPOConfig)
    cfg.env.prompts_per_step = 2
    env = make_env(cfg, tokenizer, records=records)
    assert len(env) + env.num_skipped == len(records)
    assert all(len(row[2]) <= cfg.env.max_prompt_tokens for row in env._rows)

    prompts = env.reset()
    refs = list(prompts["reference"])
    for idx, text, ref in zip(prompts["prompt_index"].tolist(), prompts["prompt"], refs, strict=True):
        assert records[idx]["question"] in text
        assert SYSTEM_PROMPTS["hash"] in text
        assert ref == reference_answer(records[idx]["answer"])

    responses = [
        f"So the answer is this.\n#### {refs[0]}",
        "I am not sure.",
        f"Adding up gives {refs[1]}.",
        "It is\n#### 123456789",
    ]
    td = env.step(answers_td(prompts, responses, group_size=2))
    correct = td["next", "reward_correct"].flatten().tolist()
    fmt = td["next", "reward_format"].flatten().tolist()
    assert correct == [1.0, 0.0, 1.0, 0.0]  # the third is found by the last-number fallback
    assert fmt == [1.0, 0.0, 0.0, 1.0]
    total = td["next", "reward"].flatten().tolist()
    assert total == pytest.approx(
        [c * cfg.reward.correctness_weight + f * cfg.reward.format_weight for c, f in zip(correct, fmt, strict=True)]
    )
