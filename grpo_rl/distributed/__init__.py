"""Distribution: Ray actors for collectors and references (:mod:`.actors`, :mod:`.reference_actors`), the
bounded buffer between them and the learner (:mod:`.buffer`), the asynchronous loop's rollout source
(:mod:`.pipeline`), learner groups over torch.distributed (:mod:`.learner_group`, :mod:`.data_parallel`) and FSDP2
sharding (:mod:`.sharding`).

Importing this package does not import Ray; each module imports it when it needs it. May import
:mod:`grpo_rl.weights` and below.
"""
