"""Placement: which devices, threads and Ray resources each role gets, decided once per run.

:mod:`.devices` turns ``num_devices`` per role into device lists; :mod:`.context` builds the run context every
role receives its slice of (precision, placement, the actor spec); :mod:`.ray` starts or joins Ray sized for
the roles. May import :mod:`grpo_rl.model` and below.
"""
