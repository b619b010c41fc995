"""Against TRL: our synchronous step and TRL's ``GRPOTrainer`` alternated on one workload (``trl_compare.py``,
``scaling.py``; TRL runs in ``benchmarks/.venv-trl``, made by ``setup_trl_env.sh``), and our objectives' loss and
gradient against TRL's (``trl_objectives.py``)."""
