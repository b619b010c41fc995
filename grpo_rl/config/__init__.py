"""Configuration: the schema every Hydra YAML is checked against (:mod:`.schema`) and the pure checks of its
values (:mod:`.checks`).

The bottom layer: imports nothing of the package but :mod:`grpo_rl.errors`. Checks that need files, devices or
user code are the preflight's (:mod:`grpo_rl.run.preflight`).
"""
