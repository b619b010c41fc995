"""Tests for grpo_rl.model.compile: train.compile's decision, the compiled layers' numbers, resume, and the fallback."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from grpo_rl.config.schema import parse_compile_mode as parse_mode
from grpo_rl.errors import ConfigError
from grpo_rl.model import compile as compile_mod
from grpo_rl.model.compile import COMPILE_COST_S, DECIDE_AFTER, SAVING, CompileDecision
from grpo_rl.model.logprobs import sequence_logprobs
from grpo_rl.training.learner import Learner, LossSettings
from grpo_rl.training.reference import RefScorer
from tests.unit.training.test_learner import make_batch

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("value", "mode"),
    [("auto", "auto"), (True, "true"), (False, "false"), ("On", "true"), ("off", "false"), ("maybe", "maybe")],
)
def test_parse_mode_accepts_bools_and_words(value, mode):
    assert parse_mode(value) == mode


def test_config_rejects_an_unknown_mode():
    from grpo_rl.api import compose
    from grpo_rl.run.preflight import validate

    cfg = compose(overrides=["train.compile=sometimes"])
    with pytest.raises(ConfigError, match=r"train.compile='sometimes' is not valid; choose one of auto, true, false"):
        validate(cfg)


def test_auto_compiles_only_when_the_steps_left_repay_it():
    per_step = COMPILE_COST_S / SAVING / 10  # the saving of 10 steps equals the cost
    long_run = CompileDecision("auto", total_steps=DECIDE_AFTER + 11)
    assert not long_run.observe(per_step * 3, steps_done=1)  # the first step only records
    assert long_run.observe(per_step, steps_done=2)  # 11 steps left: min of the two timings, worth 1.1x the cost
    assert not long_run.observe(per_step, steps_done=3)  # decided once
    short_run = CompileDecision("auto", total_steps=DECIDE_AFTER + 9)
    short_run.observe(per_step, 1)
    assert not short_run.observe(per_step, 2)  # 9 steps left: worth 0.9x the cost
    for mode in ("true", "false"):  # explicit settings never decide by time
        fixed = CompileDecision(mode, total_steps=10_000)
        assert not any(fixed.observe(1e6, s) for s in range(1, 4))


def _grouped_batch(seed=0):
    batch = make_batch([5, 5, 7, 7], [4, 2, 3, 5], seed=seed)
    batch["prompt_ids"][1] = batch["prompt_ids"][0]
    batch["prompt_mask"][1] = batch["prompt_mask"][0]
    batch["prompt_ids"][3] = batch["prompt_ids"][2]
    batch["prompt_mask"][3] = batch["prompt_mask"][2]
    batch["group_id"] = torch.tensor([0, 0, 1, 1])
    batch["advantage"] = torch.tensor([1.0, -1.0, 0.5, -0.5])
    return batch


def test_compiled_layers_give_the_eager_logprobs_and_gradients(tiny_model):
    """Packed micro-batches of changing shapes through compiled decoder layers: the eager log-probs and gradients,
    to float tolerance (the dynamic graph serves every shape)."""
    eager, compiled = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    assert compile_mod.compile_model(compiled, CPU, "test")
    for seed in (0, 1):
        batch = _grouped_batch(seed)
        outs = []
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            lp = sequence_logprobs(model, batch, share_prompt=True, with_entropy=True)
            (lp.logprobs.sum() + 0.1 * lp.entropy.sum()).backward()
            outs.append(lp)
        torch.testing.assert_close(outs[1].logprobs, outs[0].logprobs, rtol=1e-4, atol=1e-5)
        assert torch.count_nonzero(outs[0].logprobs) > 0
        for (name, a), b in zip(eager.named_parameters(), compiled.parameters(), strict=True):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-6, msg=name)


def test_compiled_learner_steps_like_the_eager_one_and_resumes_compiled(tiny_model):
    """One optimizer step of a learner with train.compile=true: the eager loss and gradient norm. The decision is in
    the checkpointed state, so a resumed learner compiles too, unless the resumed run says false."""
    eager = Learner(copy.deepcopy(tiny_model), CPU, LossSettings(tis_cap=None), lr=1e-3, share_prompt=True)
    compiled = Learner(
        copy.deepcopy(tiny_model), CPU, LossSettings(tis_cap=None), lr=1e-3, share_prompt=True, compile="true"
    )
    assert compiled.compiled and not eager.compiled
    batch = _grouped_batch(0)
    m_eager, m_compiled = eager.train_step(batch.clone()), compiled.train_step(batch.clone())
    assert m_eager["grad_norm"] > 0
    for key in ("loss", "grad_norm", "entropy"):
        assert m_compiled[key] == pytest.approx(m_eager[key], rel=1e-4), key

    state = compiled.state_dict()
    assert state["compiled"] is True
    resumed = Learner(
        copy.deepcopy(tiny_model),
        CPU,
        LossSettings(tis_cap=None),
        lr=1e-3,
        share_prompt=True,
        compile="auto",
        total_steps=3,
    )
    assert not resumed.compiled
    resumed.load_state_dict(state)
    assert resumed.compiled
    refused = Learner(copy.deepcopy(tiny_model), CPU, LossSettings(tis_cap=None), lr=1e-3, compile="false")
    refused.load_state_dict(state)
    assert not refused.compiled  # an explicit false wins over the checkpoint


def test_compiled_reference_scores_like_the_eager_one(tiny_model):
    model = copy.deepcopy(tiny_model).eval()
    batch = _grouped_batch(3)
    eager = RefScorer(copy.deepcopy(model), CPU, share_prompt=True).score(batch.clone())["ref_logprobs"]
    ref = RefScorer(model, CPU, share_prompt=True)
    ref.compile()
    assert ref.compiled
    torch.testing.assert_close(ref.score(batch.clone())["ref_logprobs"], eager, rtol=1e-4, atol=1e-5)


def test_a_broken_toolchain_leaves_the_learner_eager_with_one_line(tiny_model, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("InductorError: CppCompileError: C++ compile error\nmany more lines")

    monkeypatch.setattr(torch, "compile", broken)
    compile_mod.compiler_problem.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="grpo_rl.model.compile"):
            learner = Learner(tiny_model, CPU, LossSettings(tis_cap=None), lr=1e-3, compile="true")
    finally:
        compile_mod.compiler_problem.cache_clear()
    assert not learner.compiled
    assert all(getattr(layer, "_compiled_call_impl", None) is None for layer in compile_mod.decoder_layers(tiny_model))
    [record] = [r for r in caplog.records if "train.compile" in r.getMessage()]
    assert "stays eager" in record.getMessage() and "C++ compile error" in record.getMessage()
    assert "many more lines" not in record.getMessage()
    learner.train_step(_grouped_batch())  # and it trains
