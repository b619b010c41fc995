"""Rollout engines: the protocol and batch layout (:mod:`.base`), vLLM (:mod:`.vllm_engine`), Hugging Face
generate (:mod:`.transformers_engine`), vLLM servers spoken to over HTTP (:mod:`.served`, started and stopped by
:mod:`.server`; :mod:`.vllm_plugin` and :mod:`.file_transfer` run inside the servers), the scale simulation's
stand-in (:mod:`.simulated`), and the factory that picks one from ``inference_model`` (:mod:`.build`).

An engine knows nothing of the learner. May import :mod:`grpo_rl.placement` and below.
"""
