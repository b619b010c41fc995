"""Evaluation: the pass@k estimator by hand, greedy accuracy and pass@k on a scripted engine, the schedule, the
held-out split, and the standalone command on a checkpoint (transformers engine, tiny model)."""

from __future__ import annotations

import json
from math import comb

import pytest
import torch
from omegaconf import OmegaConf

from grpo_rl.engines.base import pack_rollouts
from grpo_rl.envs.base import PromptEnv
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent
from grpo_rl.rollout.evaluation import Evaluator, pass_at_k, solved


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - comb(7, 4) / comb(10, 4))
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


class ScriptedEngine:
    """Answers the i-th prompt of a call with ``greedy[i]`` at temperature 0, else with ``sampled[i][:n]``."""

    def __init__(self, tokenizer, greedy: list[str], sampled: list[list[str]]):
        self.tokenizer, self.greedy, self.sampled = tokenizer, greedy, sampled
        self.calls: list[tuple[list[list[int]], int, float]] = []

    def generate(self, prompts, n, sampling):
        self.calls.append(([list(p) for p in prompts], n, sampling.temperature))
        texts = [
            t
            for i in range(len(prompts))
            for t in ([self.greedy[i]] if sampling.temperature == 0 else self.sampled[i][:n])
        ]
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return pack_rollouts(
            prompts, ids, [[0.0] * len(x) for x in ids], [False] * len(ids), n, self.tokenizer.pad_token_id
        )


def _exact(responses, references):
    return [1.0 if r.strip() == ref else 0.0 for r, ref in zip(responses, references, strict=True)]


def _env(tokenizer, num_prompts: int) -> PromptEnv:
    records = [{"q": f"Say the word number {i}.", "a": f"word{i}"} for i in range(5)]
    return PromptEnv(
        records,
        tokenizer,
        CompositeReward([RewardComponent("correct", _exact)]),
        format_messages=lambda r: [{"role": "user", "content": r["q"]}],
        reference_of=lambda r: r["a"],
        prompts_per_step=num_prompts,
        max_prompt_tokens=128,
        shuffle=False,
    )


def _evaluator(tokenizer, every: int = 0):
    greedy = ["word0", "wrong", "word2"]
    sampled = [["x", "y", "z", "w"], ["word1", "y", "z", "w"], ["word2"] * 4]  # c = 0, 1, 4
    engine = ScriptedEngine(tokenizer, greedy, sampled)
    ev = Evaluator(
        _env(tokenizer, 3),
        engine,
        tokenizer,
        pass_k=2,
        num_samples=4,
        temperature=1.0,
        max_new_tokens=8,
        success_component="correct",
        every=every,
    )
    return ev, engine


def test_greedy_accuracy_and_pass_at_k(tokenizer):
    ev, engine = _evaluator(tokenizer)
    metrics = ev.evaluate()
    assert metrics["eval/accuracy"] == pytest.approx(2 / 3)
    assert metrics["eval/pass@2"] == pytest.approx((0.0 + 0.5 + 1.0) / 3)
    assert metrics["eval/sample_accuracy"] == pytest.approx(5 / 12)
    assert metrics["eval/num_prompts"] == 3
    assert [(n, t) for _, n, t in engine.calls] == [(1, 0.0), (4, 1.0)]
    assert [a["solved"] for a in ev.last_answers] == [True, False, True]


class InterleavingEngine(ScriptedEngine):
    """Returns the sampled answers with the groups' rows interleaved (a group is its ``group_id``, not a run of
    rows)."""

    def generate(self, prompts, n, sampling):
        out = super().generate(prompts, n, sampling)
        if sampling.temperature == 0:
            return out
        order = torch.arange(out.batch_size[0]).view(-1, n).t().reshape(-1)  # prompt 0, 1, 2, 0, 1, 2, ...
        return out[order]


def test_pass_at_k_counts_by_group_id_whatever_the_row_order(tokenizer):
    ev, _ = _evaluator(tokenizer)
    ev.sampled.engine = ev.greedy.engine = InterleavingEngine(
        tokenizer, ev.greedy.engine.greedy, ev.greedy.engine.sampled
    )
    metrics = ev.evaluate()
    assert metrics["eval/pass@2"] == pytest.approx((0.0 + 0.5 + 1.0) / 3)
    assert metrics["eval/sample_accuracy"] == pytest.approx(5 / 12)


def test_every_evaluation_sees_the_same_prompts(tokenizer):
    ev, engine = _evaluator(tokenizer)
    first = ev.evaluate()
    second = ev.evaluate()
    assert engine.calls[0][0] == engine.calls[2][0] == engine.calls[1][0]
    assert {k: v for k, v in first.items() if k != "eval/seconds"} == {
        k: v for k, v in second.items() if k != "eval/seconds"
    }


def test_schedule_every_n_steps_and_the_last(tokenizer):
    ev, _ = _evaluator(tokenizer, every=2)
    done = [step for step in range(1, 6) if ev.maybe_evaluate(step, last_step=5)]
    assert done == [2, 4, 5]
    off, _ = _evaluator(tokenizer, every=0)
    assert off.maybe_evaluate(5, last_step=5) == {}


def test_solved_without_a_component_uses_the_total_reward():
    from tensordict import TensorDict

    batch = TensorDict(
        {"reward": torch.tensor([1.0, 0.99, 1.5]), "reward_x": torch.tensor([0.0, 1.0, 0.0])}, batch_size=[3]
    )
    assert solved(batch, None).tolist() == [True, False, True]
    assert solved(batch, "x").tolist() == [False, True, False]
    with pytest.raises(KeyError, match="reward_y"):
        solved(batch, "y")


def _cfg(model_dir, **overrides):
    from grpo_rl.config.schema import GRPOConfig

    cfg = OmegaConf.structured(GRPOConfig)
    cfg.model.name = str(model_dir)
    cfg.env.max_prompt_tokens = 400
    cfg.sampling.max_new_tokens = 4
    cfg.inference_model.max_model_len = 512
    cfg.inference_model.engine = "transformers"
    cfg.logger.backend = "none"
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def test_make_evaluator_uses_the_first_test_prompts_in_file_order(tokenizer, tiny_model_dir):
    from grpo_rl.envs.data import load_records
    from grpo_rl.rollout.evaluation import make_evaluator
    from grpo_rl.run.setup import make_run

    try:
        records = load_records("gsm8k", split="test")
    except FileNotFoundError as e:
        pytest.skip(f"GSM8K test split not available: {e}")
    run = make_run(_cfg(tiny_model_dir, **{"eval.num_prompts": 3}), tiny_model_dir.parent / "eval_run")
    ev = make_evaluator(run, engine=None, every=1)
    prompts = list(ev.env.reset()["prompt"])
    assert len(prompts) == 3
    for prompt, record in zip(prompts, records[:3], strict=True):
        assert record["question"] in prompt


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_standalone_evaluation_of_a_checkpoint(tiny_model, tiny_model_dir, tokenizer, tmp_path, lora, capsys):
    """``python -m grpo_rl.cli.evaluate checkpoint=...`` on a full and on an adapter-only (LoRA) checkpoint."""
    from grpo_rl.cli.evaluate import main
    from grpo_rl.run.checkpoint import Checkpointer

    overrides = {"model.lora.enabled": lora, "model.lora.r": 4, "model.lora.target_modules": ["q_proj"]}
    cfg = _cfg(tiny_model_dir, **overrides)
    model = tiny_model
    if lora:
        from grpo_rl.model.lora import apply_lora

        model = apply_lora(tiny_model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj"])
    path = Checkpointer(tmp_path).save(
        1, model, tokenizer, {}, export_model_dir=False, config_yaml=OmegaConf.to_yaml(cfg)
    )
    assert (path / "model").exists() != lora

    metrics = main([f"checkpoint={path}", "eval.num_prompts=2", "eval.pass_k=2", "eval.num_samples=3"])
    assert metrics["eval/num_prompts"] == 2 and 0.0 <= metrics["eval/accuracy"] <= 1.0
    assert 0.0 <= metrics["eval/pass@2"] <= 1.0
    saved = json.loads((path / "eval_results.json").read_text())
    assert saved["eval/accuracy"] == metrics["eval/accuracy"] and saved["split"] == "test"
    assert "eval/accuracy" in capsys.readouterr().out
