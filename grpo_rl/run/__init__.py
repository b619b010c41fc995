"""The run: its start and preflight (:mod:`.setup`, :mod:`.preflight`), which implementation of each role it uses
(:mod:`.roles`), the one loop (:mod:`.loop`), stopping, resuming and exporting (:mod:`.lifecycle`), checkpoints
(:mod:`.checkpoint`) and logs (:mod:`.metrics`, :mod:`.sample_log`).

May import every package but :mod:`grpo_rl.cli` and :mod:`grpo_rl.api`.
"""
