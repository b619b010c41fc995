# %% [markdown]
# # GRPO on a model you already hold
#
# The model and tokenizer are Python objects, as with TRL's `GRPOTrainer(model=..., processing_class=...)`: the
# run writes them once into its folder (the engine loads a folder), trains, and loads the trained weights back into
# the same object. Open this file as a notebook (Jupyter with jupytext, or VS Code's `# %%` cells), or run it:
#
#     python examples/notebook_model_objects.py                      # embedded SmolLM2-135M-Instruct on the CPU
#     python examples/notebook_model_objects.py /path/to/hf_model train.steps=3 output_dir=runs/objects

# %%
import re
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_rl.api import Trainer
from grpo_rl.model.loading import resolve_model

# %% [markdown]
# The model, loaded (or built, or fine-tuned) however you like. Here: the embedded SmolLM2-135M-Instruct, or the
# folder given on the command line.

# %%
args = sys.argv[1:]
folder = args.pop(0) if args and Path(args[0]).is_dir() else resolve_model("embedded:smollm2-135m-instruct")
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(folder)
before = {name: p.detach().clone() for name, p in model.named_parameters()}

# %% [markdown]
# Prompts and rewards, as in `examples/notebook_api.py`: correctness, and a little for brevity.

# %%
prompts = [{"prompt": f"What is {a} + {b}? Reply with the number only.", "ground_truth": str(a + b)}
           for a, b in [(12, 30), (25, 17), (41, 8), (33, 33), (19, 64), (50, 25), (7, 88), (46, 46)]]


def correct(responses, references):
    """1 when the last number in the answer is the reference."""
    scores = []
    for response, reference in zip(responses, references):
        numbers = re.findall(r"-?\d+", response)
        scores.append(float(bool(numbers) and numbers[-1] == reference))
    return scores


def brevity(responses, references):
    """1 for at most 8 words, falling to 0 at 40."""
    return [max(0.0, min(1.0, (40 - len(r.split())) / 32)) for r in responses]


# %%
trainer = Trainer(model=model, tokenizer=tokenizer, prompts=prompts,
                  rewards={"correct": (correct, 1.0), "brevity": (brevity, 0.2)},
                  overrides=["train.steps=4", "env.prompts_per_step=2", "env.group_size=4",
                             "sampling.max_new_tokens=24", "eval.every=0", *args])
result = trainer.train()

# %% [markdown]
# `model` now holds the trained weights (the run folder keeps them too, as `final_model`, beside the
# `initial_model` it started from).

# %%
changed = sum(not torch.equal(before[name], p) for name, p in model.named_parameters())
print(f"{changed} of {len(before)} parameter tensors of `model` changed; the run folder: {result.run_dir}")
