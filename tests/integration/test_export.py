"""An exported model folder (``final_model``, a checkpoint's ``model/``) reloads in transformers and in vLLM.

The exported model's weights are perturbed away from the tiny model's initial ones first, so a reload that
silently fell back to other weights would be caught: transformers must give back the exact tensors, and vLLM's
log-probs of its own sampled answer must match the exported model's log-probs of the same tokens.
"""

from __future__ import annotations

import json

import pytest
import torch
from tensordict import TensorDict

from grpo_rl.model.logprobs import sequence_logprobs
from grpo_rl.run.checkpoint import export_model_atomic

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CPU = torch.device("cpu")


@pytest.fixture
def exported(tiny_model, tokenizer, tmp_path):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return tiny_model, export_model_atomic(tiny_model, tokenizer, tmp_path / "final_model")


def test_export_folder_has_weights_tokenizer_and_chat_template(exported, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, out = exported
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    has_template = "chat_template.jinja" in names or "chat_template" in tokenizer_config
    assert has_template, f"no chat template in {sorted(names)}"

    reloaded = AutoModelForCausalLM.from_pretrained(out)
    for key, value in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], value), key
    tok = AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    assert tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    ) == tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_vllm_loads_the_export_and_generates_with_its_weights(exported, tokenizer):
    pytest.importorskip("vllm")
    from grpo_rl.engines.base import SamplingSpec
    from grpo_rl.engines.vllm_engine import VLLMEngine

    model, out = exported
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name a colour."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tokenizer.encode(text, add_special_tokens=False)
    engine = VLLMEngine(str(out), CPU, max_model_len=256, kv_cache_gb=1, seed=0)
    try:
        batch = engine.generate([prompt], 1, SamplingSpec(max_new_tokens=8, temperature=1.0, seed=1))
    finally:
        engine.shutdown()
    assert batch["response_mask"].sum() > 0
    with torch.no_grad():
        ours = sequence_logprobs(
            model.eval(),
            TensorDict(
                {k: batch[k] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")},
                batch_size=batch.batch_size,
            ),
        ).logprobs
    torch.testing.assert_close(batch["behavior_logprobs"], ours, rtol=0, atol=2e-3)
