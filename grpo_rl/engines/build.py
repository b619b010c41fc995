"""The rollout engine of this process, from ``inference_model`` and the run's placement: vLLM, Hugging Face
generate (``transformers``), or the scale simulation's timed stand-in."""
from __future__ import annotations

import logging
import torch
from grpo_rl.placement.context import RunContext

log = logging.getLogger(__name__)



def make_engine(run: RunContext, policy: torch.nn.Module | None = None):
    """The rollout engine on ``run.devices.inference[0]``. ``policy``: the learner's model, which a
    ``transformers`` engine generates with under ``inference_model.share_weights`` (no copy of its own)."""
    cfg = run.cfg.inference_model
    device = run.devices.inference[0]
    sim = run.cfg.simulate
    if sim.enabled:
        from grpo_rl.engines.simulated import SimulatedEngine

        return SimulatedEngine(vocab_size=len(run.tokenizer), seconds=sim.generation_seconds, jitter=sim.jitter,
                               answer_tokens=sim.answer_tokens, pad_id=run.tokenizer.pad_token_id or 0)
    kwargs = dict(dtype=run.precision.inference.dtype)
    if cfg.engine == "vllm":
        from grpo_rl.engines.vllm_engine import VLLMEngine

        return VLLMEngine(run.model_path, device, max_model_len=cfg.max_model_len, seed=run.cfg.seed,
                          kv_cache_gb=cfg.kv_cache_gb, gpu_memory_utilization=cfg.gpu_memory_utilization,
                          enforce_eager=cfg.enforce_eager, enable_prefix_caching=cfg.enable_prefix_caching,
                          **kwargs)
    from grpo_rl.engines.transformers_engine import TransformersEngine

    if cfg.share_weights and policy is not None:
        return TransformersEngine.sharing(policy, run.tokenizer, device, **kwargs)
    return TransformersEngine(run.model_path, device, compile=cfg.compile, **kwargs)
