"""IFEval: its environment (:mod:`.env`), reward components (:mod:`.reward`) and instruction checkers
(:mod:`.instructions`)."""
