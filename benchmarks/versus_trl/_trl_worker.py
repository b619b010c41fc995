"""TRL's side of ``trl_compare.py``: ``trl.GRPOTrainer`` on the same workload, one optimizer step per 'step' command.

    benchmarks/.venv-trl/bin/python benchmarks/versus_trl/_trl_worker.py --prompts P.json --model DIR --threads 2
        [--bf16] [--group-size G --max-new-tokens N --prompts-per-step P]   # scaling.py; default: WORKLOAD's

``use_cpu=True``, no vLLM (transformers ``generate``), a reference model (``beta=0.04``), one optimizer step per
generation batch of 4 prompts x 4 completions, the same reward functions and weights as our side. A callback
blocks at the start of every step until the orchestrator says 'step', and reports the step when TRL logs it.
Phase times come from timing wrappers around the policy's ``generate`` and the trainer's log-prob function
(calls without gradient are the reference pass). Emits protocol lines (see ``benchmarks/common/workload.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common.machine import peak_rss_gib, set_threads  # noqa: E402
from benchmarks.common.workload import REWARD_WEIGHTS, WORKLOAD, brevity, correct, emit, format_, wait_for_command  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--model", required=True, help="local HF folder of the model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="Trainer bf16 (autocast, fp32 master weights)")
    parser.add_argument("--steps", type=int, required=True, help="total optimizer steps, warm-up included")
    parser.add_argument("--group-size", type=int, default=WORKLOAD["group_size"])
    parser.add_argument("--max-new-tokens", type=int, default=WORKLOAD["max_new_tokens"])
    parser.add_argument("--prompts-per-step", type=int, default=WORKLOAD["prompts_per_step"])
    args = parser.parse_args()
    set_threads(args.threads)
    t_start = time.perf_counter()

    import datasets
    import torch
    import transformers
    import trl
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = json.loads(Path(args.prompts).read_text())
    dataset = datasets.Dataset.from_list(
        [{"prompt": r["messages"], "answer": r["reference"], "prompt_index": r["prompt_index"]} for r in rows]
    )
    # The workload, with the sizes scaling.py varies (the defaults are WORKLOAD's own values).
    w = dict(
        WORKLOAD, group_size=args.group_size, max_new_tokens=args.max_new_tokens, prompts_per_step=args.prompts_per_step
    )
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_compare_trl_"),
        use_cpu=True,
        bf16=args.bf16,
        fp16=False,
        seed=w["seed"],
        per_device_train_batch_size=w["prompts_per_step"] * w["group_size"],
        gradient_accumulation_steps=1,
        num_generations=w["group_size"],
        max_completion_length=w["max_new_tokens"],
        temperature=w["temperature"],
        top_p=1.0,
        top_k=0,
        beta=w["kl_coef"],
        epsilon=0.2,
        epsilon_high=0.28,
        learning_rate=w["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta2=0.99,
        max_grad_norm=1.0,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        shuffle_dataset=False,
        use_vllm=False,
        disable_tqdm=True,
        log_completions=False,
        reward_weights=[REWARD_WEIGHTS["correct"], REWARD_WEIGHTS["format"], REWARD_WEIGHTS["brevity"]],
        dataloader_num_workers=0,
    )

    seen_prompts: list[int] = []
    completion_tokens: list[int] = []
    rewards: list[float] = []

    def reward_correct(prompts, completions, answer, prompt_index, completion_ids, **kw):
        seen_prompts.extend(prompt_index[:: w["group_size"]])
        completion_tokens.append(sum(len(c) for c in completion_ids))
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        r = correct(texts, answer)
        f, b = format_(texts, answer), brevity(texts)
        rewards.extend(
            REWARD_WEIGHTS["correct"] * x + REWARD_WEIGHTS["format"] * y + REWARD_WEIGHTS["brevity"] * z
            for x, y, z in zip(r, f, b, strict=True)
        )
        return r

    def reward_format(completions, answer, **kw):
        return format_([c[0]["content"] if isinstance(c, list) else c for c in completions], answer)

    def reward_brevity(completions, **kw):
        return brevity([c[0]["content"] if isinstance(c, list) else c for c in completions])

    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=[reward_correct, reward_format, reward_brevity],
        args=config,
        train_dataset=dataset,
    )

    timers = {"generation_s": 0.0, "reference_s": 0.0, "policy_logprob_s": 0.0}

    def timed(fn, key_of):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timers[key_of()] += time.perf_counter() - t

        return wrapper

    trainer.model.generate = timed(trainer.model.generate, lambda: "generation_s")
    trainer._get_per_token_logps_and_entropies = timed(
        trainer._get_per_token_logps_and_entropies,
        lambda: "policy_logprob_s" if torch.is_grad_enabled() else "reference_s",
    )

    class Stepper(TrainerCallback):
        """Hold each step until told to go; report it when TRL logs it."""

        def __init__(self):
            self.t0 = 0.0
            self.step = 0

        def on_train_begin(self, *a, **kw):
            emit(
                "ready",
                startup_s=time.perf_counter() - t_start,
                torch_threads=torch.get_num_threads(),
                config={
                    "bf16": args.bf16,
                    "trl": trl.__version__,
                    "transformers": transformers.__version__,
                    "torch": torch.__version__,
                    "loss_type": config.loss_type,
                },
            )

        def on_step_begin(self, *a, **kw):
            if wait_for_command() != "step":
                emit("done", peak_rss_gib=peak_rss_gib())
                os._exit(0)
            for k in timers:
                timers[k] = 0.0
            del rewards[:]
            self.t0 = time.perf_counter()

        def on_log(self, args_, state, control, logs=None, **kw):
            if not logs or "grad_norm" not in logs:
                return
            seconds = time.perf_counter() - self.t0
            n = w["prompts_per_step"]
            want = [r["prompt_index"] for r in rows[self.step * n : (self.step + 1) * n]]
            g = w["group_size"]
            groups = [rewards[i : i + g] for i in range(0, len(rewards), g)]
            std = [(sum((x - sum(gr) / g) ** 2 for x in gr) / (g - 1)) ** 0.5 for gr in groups]
            emit(
                "step",
                step=self.step,
                seconds=seconds,
                **timers,
                training_s=seconds - timers["generation_s"] - timers["reference_s"],
                completion_tokens=completion_tokens[-1],
                grad_norm=float(logs["grad_norm"]),
                reward_mean=sum(rewards) / max(1, len(rewards)),
                reward_std_within_groups=sum(std) / max(1, len(std)),
                kl_ref=float(logs.get("kl", float("nan"))),
                prompts_match=seen_prompts[-n:] == want,
                peak_rss_gib=peak_rss_gib(),
            )
            self.step += 1

    trainer.add_callback(Stepper())
    trainer.train()
    wait_for_command()
    emit("done", peak_rss_gib=peak_rss_gib())
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
