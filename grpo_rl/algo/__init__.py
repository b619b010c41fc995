"""The algorithm: GRPO's clipped surrogate with its KL penalty (:mod:`.loss`), the policy objectives it can use
(:mod:`.objectives`), group-relative advantages and KL-in-reward (:mod:`.advantages`), engine/learner mismatch
corrections (:mod:`.engine_correction`) and DAPO's overlong shaping (:mod:`.overlong`).

Pure functions of tensors and explicit scalars. May import :mod:`grpo_rl.config` and :mod:`grpo_rl.errors`.
"""
