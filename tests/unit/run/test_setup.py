"""grpo_rl.run.setup.make_run: the settings other settings decide are worked out there, before the checks (what
TorchRL's keys map to) or once the training environment is built (``train.prompt_epochs``), and the config it
returns is final: read-only, as is the run context."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from grpo_rl.run.preflight import validate
from tests.unit.helpers import ROOT, compose_config, write_jsonl

REWARD = ROOT / "examples" / "custom_reward.py"


def _cfg(model_dir, tmp_path, *extra: str):
    """A run on six prompts of a file (3 a step), scored by the example reward, on the tiny model."""
    rows = [{"prompt": f"Say a{i}.", "ground_truth": f"a{i}"} for i in range(6)]
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    return compose_config(
        [
            f"model.name={model_dir}",
            "env.dataset=file",
            f"env.path={data}",
            f"reward.path={REWARD}",
            "reward.name=contains_answer",
            "env.prompts_per_step=3",
            "env.group_size=2",
            "inference_model.engine=transformers",
            "logger.backend=none",
            *extra,
        ]
    )


def test_the_config_and_the_context_are_final_once_make_run_returns(tiny_model_dir, tmp_path):
    from grpo_rl.run.setup import make_run, make_train_env

    cfg = _cfg(tiny_model_dir, tmp_path, "train.prompt_epochs=2", "train.steps=7")
    run = make_run(cfg, tmp_path / "run")
    assert run.cfg is cfg and cfg.train.steps == 4  # ceil(2 x 6 prompts / 3 a step): no later code sets it
    assert make_train_env(run) is run.train_env and len(run.train_env) == 6  # built once, for the count
    assert OmegaConf.is_readonly(cfg)
    for key, value in (("train.steps", 5), ("seed", 1), ("env.prompts_per_step", 2), ("model.name", "x")):
        group, _, name = key.rpartition(".")
        with pytest.raises(ReadonlyConfigError):
            setattr(OmegaConf.select(cfg, group) if group else cfg, name, value)
    with pytest.raises(ReadonlyConfigError):
        cfg.env["shuffle"] = False
    with pytest.raises(ReadonlyConfigError):
        OmegaConf.update(cfg, "optimizer.lr", 1.0)
    for field in dataclasses.fields(run):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(run, field.name, getattr(run, field.name))
    validate(cfg)  # the checks write nothing: a read-only config passes them as it is
    assert cfg.train.steps == 4


def test_evaluation_changes_a_copy_of_its_own(tiny_model_dir, tmp_path):
    from grpo_rl.rollout.evaluation import eval_config
    from grpo_rl.run.setup import make_run

    run = make_run(_cfg(tiny_model_dir, tmp_path, "eval.num_prompts=5"), tmp_path / "run")
    before = OmegaConf.to_container(run.cfg)
    ev = eval_config(run.cfg)
    assert (ev.env.shuffle, ev.env.prompts_per_step) == (False, 5) and OmegaConf.is_readonly(ev)
    assert OmegaConf.to_container(run.cfg) == before


def test_without_prompt_epochs_the_training_environment_is_built_later(tiny_model_dir, tmp_path):
    from grpo_rl.run.setup import make_run, make_train_env

    run = make_run(_cfg(tiny_model_dir, tmp_path, "train.steps=7"), tmp_path / "run")
    assert run.train_env is None and run.cfg.train.steps == 7 and OmegaConf.is_readonly(run.cfg)
    assert len(make_train_env(run)) == 6


def test_torchrl_keys_are_set_before_the_checks(tiny_model_dir, tmp_path):
    from grpo_rl.run.setup import make_run

    cfg = _cfg(tiny_model_dir, tmp_path, "env.num_envs=4", "train.total_dialog_turns=12")
    run = make_run(cfg, tmp_path / "run")
    assert (run.cfg.env.prompts_per_step, run.cfg.train.steps) == (2, 3)  # 4 answers / 2 a prompt; 12 / 4 a step
    derived = OmegaConf.to_container(cfg)
    validate(cfg)  # a derived config (a resumed run's, an actor's copy) checks as it is, changing nothing
    assert OmegaConf.to_container(cfg) == derived


def test_actors_get_their_sections_read_only(tiny_model_dir, tmp_path):
    import torch
    from omegaconf.errors import ConfigAttributeError

    from grpo_rl.placement.context import ACTOR_SECTIONS
    from grpo_rl.run.setup import make_run

    cfg = _cfg(tiny_model_dir, tmp_path, "train.steps=7", "policy.kl_coef=0.01", "ref_model.placement=actor")
    run = make_run(cfg, tmp_path / "run", mode="async")
    threads = torch.get_num_threads()
    for role in ("collector", "reference", "learner"):
        spec = run.actor_spec(role, 0)
        assert tuple(spec.cfg) == ACTOR_SECTIONS[role]  # the slice, not the whole config
        try:
            actor = spec.enter()  # sets this process's threads, as in an actor
        finally:
            torch.set_num_threads(threads)
        whole = OmegaConf.to_container(cfg, resolve=True)
        assert OmegaConf.to_container(actor.cfg) == {name: whole[name] for name in ACTOR_SECTIONS[role]}
        assert actor.precision == run.precision and actor.uses_ref
        with pytest.raises(ConfigAttributeError):
            actor.cfg.logger  # noqa: B018  (the driver's alone: reading it in an actor fails at once)
        with pytest.raises(ReadonlyConfigError):
            actor.cfg.seed = 8
        with pytest.raises(dataclasses.FrozenInstanceError):
            actor.mode = "sync"
    assert "optimizer" not in run.actor_spec("collector", 0).cfg and "eval" not in run.actor_spec("learner", 0).cfg
