"""The model: loading (:mod:`.loading`), the learner's log-probs (:mod:`.logprobs`) and vocabulary passes
(:mod:`.vocab`), sequence packing (:mod:`.packing`), LoRA (:mod:`.lora`), compilation (:mod:`.compile`), the
precision each device runs at (:mod:`.precision`) and the optimizer (:mod:`.optim`).

May import :mod:`grpo_rl.algo` and below.
"""
