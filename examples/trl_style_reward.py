"""A reward function written for TRL's GRPOTrainer, used as is (recognised by its parameter names):

    python sota/grpo.py env.dataset=file env.path=examples/prompts.jsonl \
        reward.path=examples/trl_style_reward.py reward.name=brevity_reward

Called once per batch: ``prompts`` and ``completions`` are lists, and the keywords are the data columns
(``max_words`` here) plus the references as ``ground_truth``. None means "no reward for this answer".
"""


def brevity_reward(prompts, completions, max_words=None, **kwargs):
    """1.0 within the row's word limit, shrinking beyond it; None for a row without a limit."""
    limits = max_words or [None] * len(completions)
    return [None if limit is None else min(1.0, limit / max(1, len(text.split())))
            for text, limit in zip(completions, limits)]
