"""Models given as objects (grpo_rl.run.model_objects): written into the run folder and named in the config, a
peft model merged with its adapter shape taken, kept when resuming, and the trained weights copied back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_rl.errors import ConfigError
from grpo_rl.model.lora import apply_lora, merged_state_dict
from grpo_rl.run.model_objects import ModelObjects, copy_trained_weights, write_model_objects
from grpo_rl.run.preflight import check_reference_folder
from tests.unit.helpers import compose_config


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_same_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """``got`` holds exactly ``want``: the same names, and equal values under each."""
    assert sorted(got) == sorted(want), (sorted(set(got) - set(want)), sorted(set(want) - set(got)))
    unequal = [k for k in want if not torch.equal(got[k], want[k])]
    assert not unequal, unequal


def saved_form(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` as ``save_pretrained`` writes it: the tiny model's LM head is tied to its embedding and is left
    out (it is loaded back from the embedding)."""
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
    return {k: v for k, v in state.items() if k != "lm_head.weight"}


def test_a_plain_model_is_written_once_and_named(tiny_model, tokenizer, tmp_path):
    cfg = compose_config()
    write_model_objects(cfg, tmp_path, ModelObjects(model=tiny_model, tokenizer=tokenizer, ref_model=tiny_model))
    folder = tmp_path / "initial_model"
    assert cfg.model.name == str(folder) and cfg.ref_model.path is None  # the policy as its own reference: default
    assert (folder / "tokenizer.json").is_file()
    saved = weights(folder)
    assert_same_tensors(saved, saved_form(tiny_model.state_dict()))

    with torch.no_grad():  # the caller's object trained meanwhile; a resumed run keeps the folder of its start
        next(tiny_model.parameters()).add_(1.0)
    cfg.resume = "auto"
    write_model_objects(cfg, tmp_path, ModelObjects(model=tiny_model, tokenizer=tokenizer))
    assert_same_tensors(weights(folder), saved)


def test_a_lora_model_is_written_merged_with_its_adapter_shape(tiny_model, tokenizer, tmp_path):
    model = apply_lora(tiny_model, r=4, alpha=8.0, dropout=0.05, target_modules=["q_proj", "v_proj"])
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # a trained adapter: merged weights differ from the base
    adapters = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    cfg = compose_config()
    write_model_objects(cfg, tmp_path, ModelObjects(model=model, tokenizer=tokenizer))
    lora = cfg.model.lora
    assert (lora.enabled, lora.r, lora.alpha, lora.dropout, list(lora.target_modules)) == (
        True,
        4,
        8.0,
        0.05,
        ["q_proj", "v_proj"],
    )
    saved = weights(tmp_path / "initial_model")
    merged = merged_state_dict(model)
    assert_same_tensors(saved, saved_form(merged))
    base = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.equal(saved["model.layers.0.self_attn.q_proj.weight"], base)  # the adapter is folded in
    assert all(torch.equal(model.state_dict()[k], v) for k, v in adapters.items())  # the object is unchanged
    assert not copy_trained_weights(tmp_path / "initial_model", model)  # nor written back into


def test_trained_weights_come_back_in_place(tiny_model_dir, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in trained.parameters():
            p.mul_(1.5)
    trained.save_pretrained(tmp_path / "final_model")
    assert copy_trained_weights(tmp_path / "final_model", tiny_model)
    for name, p in tiny_model.state_dict().items():
        torch.testing.assert_close(p, trained.state_dict()[name], rtol=0, atol=0)
    assert not copy_trained_weights(tmp_path / "missing", tiny_model)  # no final model: left as it is


def test_objects_that_cannot_be_models_are_config_errors(tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    with pytest.raises(ConfigError, match="model= is a dict"):
        ModelObjects(model={"weights": 1}).check()
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config._name_or_path = ""
    built = AutoModelForCausalLM.from_config(config)  # from no folder
    with pytest.raises(ConfigError, match="pass tokenizer= too"):
        ModelObjects(model=built).check()
    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # its folder has the tokenizer
    ModelObjects(model=loaded).check()


def test_a_reference_of_another_vocabulary_is_refused(tiny_model_dir, tokenizer_dir, tmp_path):
    from grpo_rl.model.loading import build_tiny_model

    check_reference_folder(str(tiny_model_dir), str(tiny_model_dir))
    other = build_tiny_model(str(tokenizer_dir), tmp_path / "other", hidden_size=32, num_heads=1)
    config = json.loads((other / "config.json").read_text())
    config["vocab_size"] += 8
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="must score the policy's token ids"):
        check_reference_folder(str(other), str(tiny_model_dir))
    with pytest.raises(ConfigError, match="no config.json"):
        check_reference_folder(str(tmp_path), str(tiny_model_dir))


def test_a_separate_reference_is_refused_with_lora():
    from grpo_rl.run.preflight import validate

    with pytest.raises(ConfigError, match="ref_model.path=/x with model.lora.enabled=true"):
        validate(compose_config(["model.lora.enabled=true", "ref_model.path=/x"]))
