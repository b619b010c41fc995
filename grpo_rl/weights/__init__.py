"""Weights from the learner to the engines, behind one protocol (:class:`.sync.WeightSync`): an in-place reload,
Ray's object store (:mod:`.sync`), or a collective broadcast (:mod:`.collective`, :mod:`.collective_sync`), each
verified by version.

May import :mod:`grpo_rl.training` and below.
"""
