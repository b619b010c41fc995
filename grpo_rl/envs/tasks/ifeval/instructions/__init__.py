"""IFEval instruction-following checkers (Zhou et al., 2023), fully offline.

A re-implementation of google-research `instruction_following_eval`
(`instructions.py`, `instructions_registry.py`, `evaluation_lib.py`) with the
same 25 instruction types, the same strict and loose scoring, and NLTK's
English Punkt model loaded from an installed wheel instead of downloaded.
Each module's docstring lists the reference quirks it keeps and the few places
it departs (no random fallbacks for missing kwargs, seeded `langdetect`,
invalid regex kwargs matched literally, and letter_frequency counting the "#"
or "!" a prompt asks for where the reference counts a random letter).

Usage::

    result = evaluate_response(response, row["instruction_id_list"], row["kwargs"], row["prompt"])
    reward = result.inst_loose_frac
"""

from grpo_rl.envs.tasks.ifeval.instructions.evaluation import IFEvalResult, evaluate_response, loose_variants
from grpo_rl.envs.tasks.ifeval.instructions.registry import INSTRUCTION_IDS, build_checker

__all__ = [
    "INSTRUCTION_IDS",
    "IFEvalResult",
    "build_checker",
    "evaluate_response",
    "loose_variants",
]
