"""A tiny sequence-classification reward model as a reward component, and its place in the device allocation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig, register_configs
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent
from grpo_rl.envs.rewards.reward_model import RewardModelScorer, build_tiny_reward_model
from grpo_rl.errors import ConfigError
from grpo_rl.placement.devices import allocate_devices
from grpo_rl.run.preflight import validate

CPU = torch.device("cpu")
CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"


@pytest.fixture(scope="module")
def reward_model_dir(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_reward_model(str(tokenizer_dir), tmp_path_factory.mktemp("tiny_rm"))


@pytest.fixture(scope="module")
def scorer(reward_model_dir: Path) -> RewardModelScorer:
    return RewardModelScorer(str(reward_model_dir), CPU, batch_size=2)


RESPONSES = ["Ottawa.", "The capital of Canada is Ottawa, on the Ottawa River.", "Toronto", "I do not know."]
PROMPTS = ["What is the capital of Canada?"] * 2 + ["Name a large Canadian city."] * 2


def test_scores_a_batch_like_one_at_a_time(scorer):
    batched = scorer(RESPONSES, [None] * 4, prompt=PROMPTS)  # two forward passes of 2, padded
    single = [scorer([r], [None], prompt=[p])[0] for r, p in zip(RESPONSES, PROMPTS, strict=True)]
    assert len(batched) == 4 and all(isinstance(v, float) for v in batched)
    torch.testing.assert_close(torch.tensor(batched), torch.tensor(single), rtol=1e-5, atol=1e-5)
    assert len(set(batched)) == 4


def test_prompt_changes_the_score(scorer):
    with_prompt = scorer(["Ottawa."], [None], prompt=["What is the capital of Canada?"])
    other_prompt = scorer(["Ottawa."], [None], prompt=["Name a fruit."])
    alone = scorer(["Ottawa."], [None])  # no prompt column: the response is scored alone
    assert with_prompt != other_prompt and with_prompt != alone
    assert "Ottawa." in scorer.format_pair(None, "Ottawa.")


def test_chat_message_prompts(scorer):
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Capital of Canada?"}]
    text = scorer.format_pair(messages, "Ottawa.")
    assert text.index("Be terse.") < text.index("Capital of Canada?") < text.index("Ottawa.")


def test_long_inputs_are_cut_from_the_left(reward_model_dir):
    short = RewardModelScorer(str(reward_model_dir), CPU, max_length=8)
    enc = short.tokenizer(
        [short.format_pair("x " * 200, "the end")], truncation=True, max_length=8, add_special_tokens=False
    )
    assert len(enc["input_ids"][0]) == 8 and short.tokenizer.decode(enc["input_ids"][0]).rstrip().endswith("<|im_end|>")
    assert len(short(["the end"], [None], prompt=["x " * 200])) == 1


def test_combined_with_a_rule_reward(scorer):
    def says_ottawa(responses, references, **columns):
        return [float("Ottawa" in r) for r in responses]

    reward = CompositeReward([RewardComponent("ottawa", says_ottawa, 1.0), RewardComponent("model", scorer, 0.5)])
    result = reward(RESPONSES, [None] * 4, prompt=PROMPTS)
    rm = torch.tensor(scorer(RESPONSES, [None] * 4, prompt=PROMPTS))
    assert result.components["ottawa"].tolist() == [1.0, 1.0, 0.0, 0.0]
    torch.testing.assert_close(result.components["model"], rm)
    torch.testing.assert_close(result.total, torch.tensor([1.0, 1.0, 0.0, 0.0]) + 0.5 * rm)


def test_more_than_one_label_is_rejected(reward_model_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(reward_model_dir)
    config.num_labels = 3
    path = tmp_path / "classifier"
    AutoModelForSequenceClassification.from_config(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(reward_model_dir).save_pretrained(path)
    with pytest.raises(ConfigError, match="num_labels=3"):
        RewardModelScorer(str(path), CPU)


def _compose(overrides: list[str] = ()):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("grpo_gsm8k", overrides=list(overrides))


def test_file_env_with_a_reward_model_alone(tmp_path, tokenizer, reward_model_dir):
    from grpo_rl.envs import make_env

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"question": p, "ground_truth": None}) + "\n" for p in PROMPTS[1:3]))
    cfg = _compose(
        [
            "env.dataset=file",
            f"env.path={data}",
            "env.prompt_column=question",
            "env.shuffle=false",
            "env.prompts_per_step=2",
            f"reward.model_path={reward_model_dir}",
            "reward.model_weight=2",
        ]
    )
    validate(cfg)
    env = make_env(cfg, tokenizer)
    from grpo_rl.envs import group_answers, rewards_per_answer

    prompts = env.reset()
    nxt = rewards_per_answer(env.step(prompts.set("response_text", group_answers(RESPONSES, 2)))["next"])  # [4]
    expected = torch.tensor(
        RewardModelScorer(str(reward_model_dir), CPU, prompt_column="question")(
            RESPONSES, [None] * 4, question=[PROMPTS[1]] * 2 + [PROMPTS[2]] * 2
        )
    )
    torch.testing.assert_close(nxt["reward_model"].squeeze(-1), expected)
    torch.testing.assert_close(nxt["reward"].squeeze(-1), 2 * expected)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["reward.model_path=/no/such/rm"], "reward.model_path=/no/such/rm: no config.json"),
        (["reward.model_path={rm}", "reward_model.num_devices=2"], "reward_model.num_devices=2"),
        (["reward_model.batch_size=0"], "reward_model.batch_size=0"),
    ],
)
def test_validate_reward_model_settings(reward_model_dir, overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(_compose([o.format(rm=reward_model_dir) for o in overrides]))


def test_a_reward_model_folder_without_a_tokenizer_is_refused_at_start(reward_model_dir, tmp_path):
    folder = Path(shutil.copytree(reward_model_dir, tmp_path / "rm"))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (folder / file).unlink()
    with pytest.raises(
        ConfigError,
        match=rf"^reward.model_path={folder}: the folder holds no tokenizer: "
        "tokenizer.json and tokenizer_config.json are missing",
    ):
        validate(_compose([f"reward.model_path={folder}"]))


# The reward_model role in the device allocation


def _cfg(**overrides):
    cfg = OmegaConf.structured(GRPOConfig)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def test_no_reward_model_no_device():
    assert allocate_devices(_cfg(), num_gpus=0, num_cpus=2).reward_model == ()
    assert allocate_devices(_cfg(), num_gpus=4).reward_model == ()


def test_reward_model_on_cpu():
    alloc = allocate_devices(_cfg(**{"reward.model_path": "/rm"}), num_gpus=0, num_cpus=2)
    assert alloc.reward_model == (CPU,) and alloc.train == (CPU,)
    assert "reward_model: [cpu]" in alloc.describe()


def test_reward_model_gets_its_own_gpu_after_the_others():
    alloc = allocate_devices(_cfg(**{"reward.model_path": "/rm"}), num_gpus=4)
    assert [d.index for d in alloc.train + alloc.ref + alloc.inference] == [0, 1, 2]
    assert alloc.reward_model == (torch.device("cuda", 3),)
    no_ref = allocate_devices(_cfg(**{"reward.model_path": "/rm"}), need_ref=False, num_gpus=4)
    assert no_ref.reward_model == (torch.device("cuda", 2),)


def test_reward_model_gpu_errors():
    with pytest.raises(ConfigError, match="needs more GPUs than the 3"):
        allocate_devices(_cfg(**{"reward.model_path": "/rm", "reward_model.num_devices": 2}), num_gpus=3)
    # One device per role on fewer GPUs than roles: they share (tests/unit/placement/test_devices.py).
    assert allocate_devices(_cfg(**{"reward.model_path": "/rm"}), num_gpus=3).reward_model == (torch.device("cuda", 1),)
    with pytest.raises(ConfigError, match="share GPUs"):
        allocate_devices(
            _cfg(**{"reward.model_path": "/rm", "reward_model.devices": [0], "train_model.devices": [0]}), num_gpus=4
        )
    explicit = allocate_devices(_cfg(**{"reward.model_path": "/rm", "reward_model.devices": [7]}), num_gpus=8)
    assert explicit.reward_model == (torch.device("cuda", 7),)
