"""Rollout engines: the protocol and batch layout (:mod:`.base`), vLLM (:mod:`.vllm_engine`), Hugging Face
generate (:mod:`.transformers_engine`), the scale simulation's stand-in (:mod:`.simulated`), and the factory
that picks one from ``inference_model`` (:mod:`.build`).

An engine knows nothing of the learner. May import :mod:`grpo_rl.placement` and below.
"""
