"""What torchrl's ``EnvBase`` costs on the training path: one ``reset`` + ``step`` of a :class:`PromptEnv`.

    .venv/bin/python benchmarks/micro/env_overhead.py                       # 4 prompts x 8 answers (the default step)
    .venv/bin/python benchmarks/micro/env_overhead.py --prompts 64 --group-size 16 --calls 200

Three ways through the environment's part of a collector step, with fixed answers and a cheap reward (exact
match), microseconds per call; each includes the collector's per-answer copy of the prompt fields into the
training batch (``prompt``, ``reference``, ``extra``), which every variant needs:

* ``plain``: the environment before it was a torchrl one, kept here: ``reset`` draws ``P`` prompts, ``step``
  scores the flat ``[P * G]`` training batch.
* ``private``: the torchrl environment's ``_reset`` / ``_step`` called directly, with the collector's reshaping
  of the answers to ``[P, G]`` (:func:`group_answers`) and of the rewards back to rows (:func:`rewards_per_answer`).
* ``envbase``: the same through ``EnvBase.reset`` / ``EnvBase.step``, as the collector calls them.

``envbase - private`` is the base class's own cost, ``envbase - plain`` the change to the training path. The
variants alternate call by call, so a change in the machine's load hits them alike; medians of the calls and of
the paired differences are printed. Prompts come from a stand-in tokenizer (characters as tokens); building the
environment is not timed. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict import NonTensorStack, TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from grpo_rl.envs.base import PromptEnv, group_answers, rewards_per_answer  # noqa: E402
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent  # noqa: E402
from grpo_rl.model.precision import cpu_flags  # noqa: E402


class CharTokenizer:
    """A chat template and characters as token ids: enough for an environment, no model files."""

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False) -> str:
        return "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def exact(responses, references, **_):
    return [float(r.strip() == ref) for r, ref in zip(responses, references, strict=True)]


def make_env(num_prompts: int) -> PromptEnv:
    records = [
        {"question": f"Tom has {i} apples and buys {i} more. How many apples does he have now?", "answer": str(2 * i)}
        for i in range(256)
    ]
    return PromptEnv(
        records,
        CharTokenizer(),
        CompositeReward([RewardComponent("correct", exact)]),
        format_messages=lambda row: [{"role": "user", "content": row["question"]}],
        reference_of=lambda row: row["answer"],
        prompts_per_step=num_prompts,
        max_prompt_tokens=4096,
    )


def gather(prompts: TensorDict, group_size: int) -> TensorDict:
    """What the collector builds for the training batch in every variant: each answer's prompt fields."""
    rows = [i // group_size for i in range(prompts.batch_size[0] * group_size)]
    batch = TensorDict(batch_size=[len(rows)])
    for key in ("prompt", "reference", "extra"):
        values = list(prompts[key])
        batch.set(key, NonTensorStack(*[values[r] for r in rows]))
    return batch


def plain_step(env: PromptEnv, answers: NonTensorStack, group_size: int) -> dict[str, torch.Tensor]:
    """The pre-torchrl ``reset`` + ``step``: ``[P]`` prompts, then the answers scored as the flat batch."""
    rows = env._next_rows()
    prompts = TensorDict(
        {
            "prompt": NonTensorStack(*[r[1] for r in rows]),
            "prompt_tokens": NonTensorStack(*[r[2] for r in rows]),
            "reference": NonTensorStack(*[r[3] for r in rows]),
            "extra": NonTensorStack(*[r[4] for r in rows]),
            "prompt_index": torch.tensor([r[0] for r in rows]),
            "done": torch.zeros(len(rows), 1, dtype=torch.bool),
        },
        batch_size=[len(rows)],
    )
    batch = gather(prompts, group_size)
    batch.set("response_text", answers)
    result = env.reward(list(batch["response_text"]), list(batch["reference"]))
    nxt = TensorDict(
        {"reward": result.total.unsqueeze(-1), "done": torch.ones(len(answers), 1, dtype=torch.bool)},
        batch_size=batch.batch_size,
    )
    for name, vals in result.components.items():
        nxt.set(f"reward_{name}", vals.unsqueeze(-1))
    batch.set("next", nxt)
    return {k: v.squeeze(-1) for k, v in nxt.items() if k.startswith("reward")}


def private_step(env: PromptEnv, answers: NonTensorStack, group_size: int) -> dict[str, torch.Tensor]:
    prompts = env._reset(None)
    gather(prompts, group_size)
    group_id = torch.arange(len(answers)) // group_size  # the engine's, as the collector passes it
    prompts.set("response_text", group_answers(answers, group_size, group_id))
    return rewards_per_answer(env._step(prompts), group_id)


def envbase_step(env: PromptEnv, answers: NonTensorStack, group_size: int) -> dict[str, torch.Tensor]:
    prompts = env.reset()
    gather(prompts, group_size)
    group_id = torch.arange(len(answers)) // group_size
    prompts.set("response_text", group_answers(answers, group_size, group_id))
    return rewards_per_answer(env.step(prompts).get("next"), group_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4, help="P, prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="G, answers per prompt")
    parser.add_argument("--calls", type=int, default=2000, help="reset + step calls per variant")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    p, g = args.prompts, args.group_size
    answers = NonTensorStack(*[f"The answer is\n{(i // g) * 2}" if i % 2 else "I do not know." for i in range(p * g)])
    variants = {"plain": plain_step, "private": private_step, "envbase": envbase_step}
    envs = {name: make_env(p) for name in variants}
    reference = None
    for name, fn in variants.items():  # warm-up, and the three agree
        out = fn(envs[name], answers, g)
        if reference is not None:
            assert all(torch.equal(out[k], reference[k]) for k in reference), name
        reference = out
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(args.calls):
        for name in names[i % 3 :] + names[: i % 3]:  # rotate the order: each variant runs first, second and third
            t0 = time.perf_counter()
            variants[name](envs[name], answers, g)
            times[name].append((time.perf_counter() - t0) * 1e6)
    print(
        f"CPU: {cpu_flags()}; torch threads {torch.get_num_threads()}; {os.cpu_count()} cores; "
        f"1-min load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"reset + step of {p} prompts x {g} answers, exact-match reward; {args.calls} calls each, interleaved")
    med = {name: statistics.median(v) for name, v in times.items()}
    for name, v in times.items():
        q = statistics.quantiles(v, n=10)
        print(f"  {name:8s} median {med[name]:9.1f} us/call   (10th-90th percentile {q[0]:.1f} .. {q[-1]:.1f})")

    def paired(a: str, b: str) -> float:
        return statistics.median(x - y for x, y in zip(times[a], times[b], strict=True))

    print(
        f"  EnvBase's own cost, median of paired differences (envbase - private): "
        f"{paired('envbase', 'private'):+.1f} us"
    )
    print(f"  change to the training path (envbase - plain): {paired('envbase', 'plain'):+.1f} us")


if __name__ == "__main__":
    main()
