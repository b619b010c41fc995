"""The run: its start and preflight (:mod:`.setup`, :mod:`.preflight`), which implementation of each role it uses
(:mod:`.roles`), the one loop (:mod:`.loop`) and what it composes: stopping (:mod:`.stopping`), the run's
checkpoints, resume and export (:mod:`.checkpoint_manager`), each step's logs (:mod:`.step_log`, :mod:`.metrics`,
:mod:`.sample_log`) and the page that shows them (:mod:`.report`); the run folder's checks (:mod:`.lifecycle`),
what a checkpoint holds (:mod:`.checkpoint`, :mod:`.manifest`) and folders written atomically (:mod:`.atomic_fs`).

May import every package but :mod:`grpo_rl.cli` and :mod:`grpo_rl.api`.
"""
