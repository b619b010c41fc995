"""A reward function written for verl, used as is (recognised by its parameter names):

    python sota/grpo.py env.dataset=file env.path=examples/prompts.jsonl \
        reward.path=examples/verl_style_reward.py reward.name=compute_score

Called once per answer: ``solution_str`` is the answer, ``ground_truth`` the row's ``ground_truth`` column,
``data_source`` the row's ``data_source`` column (None here), ``extra_info`` the row's other columns.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when the ground truth appears in the answer (case-insensitive), plus what verl logs beside it."""
    found = str(ground_truth).lower() in solution_str.lower()
    return {"score": 1.0 if found else 0.0, "found": found}
