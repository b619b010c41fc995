# %% [markdown]
# # GRPO from a notebook
#
# Prompts and reward functions as Python objects, a config from overrides, then `train()`: the same run as
# `python sota/grpo.py`, with the same logs, checkpoints and exported model in the run folder. Open this file as a
# notebook (Jupyter with jupytext, or VS Code's `# %%` cells), or run it:
#
#     python examples/notebook_api.py                        # embedded SmolLM2-135M-Instruct on the CPU
#     python examples/notebook_api.py train.steps=5 output_dir=runs/notebook

# %%
import random
import re
import sys

from grpo_rl.api import Trainer

# %% [markdown]
# Prompts: rows with a `prompt` and a `ground_truth` (plain strings work too, and so does a `datasets.Dataset`).

# %%
rng = random.Random(0)
prompts = []
for _ in range(64):
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    prompts.append({"prompt": f"What is {a} + {b}? Reply with the number only.", "ground_truth": str(a + b)})

# %% [markdown]
# Rewards: any number of functions, each in our convention `(responses, references, **columns)`, verl's
# `(data_source, solution_str, ground_truth, extra_info)` or TRL's `(prompts, completions, **kwargs)`; the
# signature says which. Each is logged as `reward_<label>`.


# %%
def correct(responses, references):
    """1 when the last number in the answer is the reference."""
    scores = []
    for response, reference in zip(responses, references):
        numbers = re.findall(r"-?\d+", response)
        scores.append(float(bool(numbers) and numbers[-1] == reference))
    return scores


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's convention: brevity, 1 for at most 8 words, falling to 0 at 40."""
    words = len(solution_str.split())
    return max(0.0, min(1.0, (40 - words) / 32))


# %% [markdown]
# The config: `config/grpo_gsm8k.yaml` (the embedded default) with overrides, as on the command line; the
# command line of this script adds its own.

# %%
overrides = ["train.steps=10", "env.prompts_per_step=4", "env.group_size=8", "sampling.max_new_tokens=32",
             "eval.every=0", *sys.argv[1:]]
trainer = Trainer(prompts=prompts, rewards={"correct": (correct, 1.0), "brevity": (compute_score, 0.2)},
                  overrides=overrides)
trainer.cfg.optimizer.lr = 1e-5  # the composed config can be edited before training

# %%
result = trainer.train()

# %%
for row in result.metrics:
    if "reward_mean" in row:
        print(f"step {row['step']:3d}  reward {row['reward_mean']:.3f}  correct {row['reward_correct_mean']:.3f}  "
              f"brevity {row['reward_brevity_mean']:.3f}")
print("final model:", result.final_model)
