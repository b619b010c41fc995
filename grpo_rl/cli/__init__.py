"""Command-line tools: what every entry point wraps (:mod:`.entry`: override checking, one-line user errors),
evaluating a checkpoint (:mod:`.evaluate`), plotting runs (:mod:`.plot`), a run's or a sweep's report page
(:mod:`.report`) and summarising a sweep (:mod:`.sweep_summary`).

May import every package but :mod:`grpo_rl.api`.
"""
