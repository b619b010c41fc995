"""A tiny model learns to call the calculator: products of 4-digit numbers, which it cannot guess.

The tiny random model is first fitted (a few seconds of supervised steps) to answer each of 4 problems in one of
two ways with equal probability: a calculator call, then the tool's result as the answer (the multi-turn pipeline's
own ids: the call, the tool message as rendered by :class:`~grpo_rl.multiturn.ToolMessages`, the answer); or a
wrong guess at once. Then ``sota/grpo.py`` trains it with the calculator on the generated arithmetic task: only the
calling branch earns the correctness reward, so within a few steps the tool-call rate and the reward rise.
"""
from __future__ import annotations

import re
import shutil

import pytest
import torch

from tests.integration.helpers import read_metrics, run_script, tiny_overrides

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TASK = ["env.dataset=arithmetic", "env.arithmetic.operations=[mul]", "env.arithmetic.digits=4",
        "env.arithmetic.mul_digits=4", "env.arithmetic.train_size=4", "env.prompts_per_step=4", "env.group_size=8",
        "env.tools=[{name: calculator}]", "env.max_turns=2", "env.max_prompt_tokens=400",
        "sampling.max_new_tokens=48", "eval.every=0", "inference_model.max_model_len=1024"]


def fit_two_branches(model_dir, out_dir, tokenizer):
    """``model_dir`` fitted so that each training problem is answered by a call (then the result) or a guess."""
    from grpo_rl.envs import make_env
    from grpo_rl.models import load_causal_lm
    from grpo_rl.multiturn import ToolMessages
    from grpo_rl.tools.format import format_tool_call
    from tests.unit.helpers import compose_config

    cfg = compose_config(TASK)
    prompts = make_env(cfg, tokenizer).reset()
    messages, eos = ToolMessages(tokenizer), tokenizer.eos_token_id
    rows = []
    for prompt, question in zip(prompts["prompt_tokens"], prompts["prompt"]):
        a, b = (int(x) for x in re.search(r"What is (\d+) \* (\d+)\?", question).groups())
        call = tokenizer.encode(format_tool_call("calculator", {"expression": f"{a}*{b}"}), add_special_tokens=False)
        answer = tokenizer.encode(f"#### {a * b}", add_special_tokens=False) + [eos]
        guess = tokenizer.encode(f"#### {a + b}", add_special_tokens=False) + [eos]
        rows.append((list(prompt), call + messages.render(str(a * b)) + answer))
        rows.append((list(prompt), guess))
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        labels[i, len(p): len(p) + len(r)] = torch.tensor(r)
        attention[i, : len(p) + len(r)] = 1
    torch.manual_seed(0)
    model = load_causal_lm(str(model_dir), torch.device("cpu"), "float32", trainable=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    predicted = labels[:, 1:] != -100  # positions whose next token is an answer token: the head runs there only
    targets = labels[:, 1:][predicted]
    for _ in range(150):
        hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1][predicted]
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    shutil.copytree(model_dir, out_dir)
    model.save_pretrained(out_dir)
    return float(loss.detach())


def test_the_tool_call_rate_and_reward_rise(tiny_model_dir, tokenizer, tmp_path):
    final_loss = fit_two_branches(tiny_model_dir, tmp_path / "fitted", tokenizer)
    assert final_loss < 0.8  # each branch memorised; what is left is the coin flip between them (ln 2 / length)
    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tmp_path / "fitted", out, steps=8)
                 if not o.startswith(("env.", "inference_model.max_model_len"))]
    proc = run_script("grpo.py", *overrides, *TASK, "optimizer.lr=2e-3", "optimizer.warmup_steps=0",
                      "policy.kl_coef=0", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    rate = [r["tool_call_rate"] for r in rows]
    correct = [r["reward_correct_mean"] for r in rows]
    print("tool-call rate per step:", rate, "\ncorrect per step:", correct)
    assert 0.2 < sum(rate[:2]) / 2 < 0.8  # the fitted coin flip
    assert sum(rate[-2:]) / 2 > sum(rate[:2]) / 2 + 0.2
    assert sum(correct[-2:]) / 2 > sum(correct[:2]) / 2 + 0.2
    assert all(r["tool_errors"] == 0 for r in rows[-2:])
