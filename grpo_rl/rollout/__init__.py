"""The rollout: the collector that drives an engine over an environment and scores the answers
(:mod:`.collector`), the rollout-source protocol and the synchronous loop's source (:mod:`.source`), DAPO's dynamic
sampling (:mod:`.dynamic_sampling`), held-out evaluation (:mod:`.evaluation`) and batch statistics (:mod:`.stats`).

May import :mod:`grpo_rl.envs` and below. The asynchronous loop's source is in :mod:`grpo_rl.distributed.pipeline`.
"""
