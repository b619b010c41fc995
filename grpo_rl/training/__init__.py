"""Training: the learner (:mod:`.learner`), the reference scorer (:mod:`.reference`), the protocols the loop
holds them by (:mod:`.protocols`), the learner's half of a step (:mod:`.step`), their factories (:mod:`.build`) and
the scale simulation's stand-ins (:mod:`.simulated`).

May import :mod:`grpo_rl.rollout` and below.
"""
