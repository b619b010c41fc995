"""The learner/engine importance ratio under sampling truncation (top-p, top-k), at step 0.

    .venv/bin/python benchmarks/micro/truncation_ratio.py                       # top_p {1, 0.9} x top_k {0, 20}
    .venv/bin/python benchmarks/micro/truncation_ratio.py --top-p 0.9 --top-k 0 --prompts 16 --group-size 8

The engine (vLLM, ``processed_logprobs``) reports each sampled token's log-prob under the distribution it drew
from: tempered, then truncated by top-k and top-p and renormalised. If the learner scored the same tokens under
the untruncated distribution, ``exp(learner - engine)`` would be the kept mass ``Z <= 1`` of each step instead of
1, and the engine correction (``policy.tis_cap``) would read that as engine drift.

Per case (every combination of ``--top-p`` and ``--top-k``) the script builds the run's components through the
factories of ``sota/grpo.py`` (config composed from ``config/grpo_gsm8k.yaml``, the embedded SmolLM2-135M-Instruct,
GSM8K train prompts, the vLLM engine, the learner), collects step 0 (learner and engine hold the same weights),
and scores the answers with the learner's own log-prob pass (the one its loss uses) and, for comparison, with the
untruncated ``sequence_logprobs``. It reports, over the answer tokens: the mean ratio ``exp(learner - engine)``,
its standard error (over tokens, and over answers from their mean ratios, as tokens of one answer are not
independent), the mean ``|log ratio|``, the fraction of tokens with ratio < 0.99, and the fraction the learner
flags as outside its own truncated set (masked out of the loss). At step 0 the reference model is the learner's
model scored untruncated, so the KL estimates between the learner's log-probs and the untruncated ones are the KL
penalty's starting value (k1 and k3, per token). ``--precision float32`` (the default) keeps
bf16 rounding out of the comparison; ``auto`` is the run's default. Writes
``benchmarks/results/truncation_ratio.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import machine, set_threads  # noqa: E402
from benchmarks.versus_trl._ours_worker import compose  # noqa: E402

MODEL_KEYS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_id")


def overrides(args: argparse.Namespace, run_dir: str, top_p: float, top_k: int) -> list[str]:
    """The run config of one case: the GSM8K default with this script's workload and sampling."""
    return [
        f"seed={args.seed}",
        f"output_dir={run_dir}",
        "model.name=embedded:smollm2-135m-instruct",
        "model.dtype=float32",
        "env.dataset=gsm8k",
        "env.split=train",
        "env.template=hash",
        f"env.prompts_per_step={args.prompts}",
        f"env.group_size={args.group_size}",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        f"sampling.temperature={args.temperature}",
        f"sampling.top_p={top_p}",
        f"sampling.top_k={top_k}",
        f"inference_model.engine={args.engine}",
        f"inference_model.precision={args.precision}",
        f"train_model.precision={args.precision}",
        "policy.kl_coef=0.0",
        "logger.backend=none",
        "eval.every=0",
    ]


def score(learner, batch, *, learner_pass: bool):
    """``[N, Lr]`` log-probs of the answers (and the learner's outside mask, or None), micro-batched as the
    learner does: its own pass (``learner_pass``) or the untruncated ``sequence_logprobs``."""
    import torch

    from grpo_rl.model.logprobs import sequence_logprobs
    from grpo_rl.model.packing import group_micro_batches, micro_batches

    shape = batch["response_ids"].shape
    logprobs = torch.zeros(shape, dtype=torch.float32)
    outside = torch.zeros(shape, dtype=torch.bool)
    seen_outside = False
    split = group_micro_batches if learner.share_prompt else micro_batches
    row = 0
    with torch.no_grad():
        for mb in split(batch.select(*MODEL_KEYS), learner.micro_batch_tokens):
            if learner_pass:
                out = learner._logprobs(mb, with_entropy=False)
            else:
                with learner._autocast():
                    out = sequence_logprobs(
                        learner.model, mb, temperature=learner.loss.temperature, share_prompt=learner.share_prompt
                    )
            n, lr = out.logprobs.shape
            logprobs[row : row + n, :lr] = out.logprobs.float()
            mask = getattr(out, "outside", None)
            if mask is not None:
                outside[row : row + n, :lr] = mask
                seen_outside = True
            row += n
    return logprobs, (outside if seen_outside else None)


def ratio_stats(learner_lp, engine_lp, mask, outside) -> dict:
    """The ratio ``exp(learner - engine)`` over the answer tokens the learner did not flag as outside."""
    import torch

    keep = mask.bool() if outside is None else mask.bool() & ~outside
    log_r = (learner_lp - engine_lp).double()  # [N, Lr]
    r = log_r.exp()
    flat = r[keep]
    n = flat.numel()
    per_answer = torch.stack([r[i][keep[i]].mean() for i in range(r.shape[0]) if keep[i].any()])
    return {
        "tokens": int(mask.sum()),
        "answers": int(per_answer.numel()),
        "ratio_mean": float(flat.mean()),
        "ratio_se_tokens": float(flat.std() / math.sqrt(n)),
        "ratio_se_answers": float(per_answer.std() / math.sqrt(per_answer.numel())),
        "abs_log_ratio_mean": float(log_r[keep].abs().mean()),
        "abs_log_ratio_max": float(log_r[keep].abs().max()),
        "frac_ratio_below_0.99": float((flat < 0.99).double().mean()),
        "frac_ratio_above_1.01": float((flat > 1.01).double().mean()),
        "outside_fraction": 0.0 if outside is None else float((outside & mask.bool()).sum() / mask.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top-p", type=float, nargs="+", default=[1.0, 0.9])
    parser.add_argument("--top-k", type=int, nargs="+", default=[0, 20], help="0: off")
    parser.add_argument("--prompts", type=int, default=8, help="GSM8K train prompts (the first step's)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--precision", default="float32", help="engine and learner: float32 | bfloat16 | auto")
    parser.add_argument("--engine", default="vllm", help="vllm | transformers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--label", default="", help="stored with the results (e.g. before / after)")
    parser.add_argument("--json", default=str(RESULTS / "truncation_ratio.json"))
    args = parser.parse_args()
    set_threads(args.threads)

    import torch

    from grpo_rl.algo.loss import kl_estimate
    from grpo_rl.engines.build import make_engine
    from grpo_rl.model.precision import cpu_flags
    from grpo_rl.rollout.collector import make_collector
    from grpo_rl.run.setup import make_run
    from grpo_rl.training.build import make_local_learner, seed_everything

    print(f"CPU: {cpu_flags()}, {os.cpu_count()} cores; torch threads {torch.get_num_threads()}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="truncation_ratio_"))
    cases = [(p, k) for p in args.top_p for k in args.top_k]
    engine, results = None, []
    for i, (top_p, top_k) in enumerate(cases):
        run_dir = str(root / f"case{i}")
        cfg = compose(overrides(args, run_dir, top_p, top_k))
        run = make_run(cfg, run_dir)
        if engine is None:  # one engine for every case: sampling settings travel with each request
            engine = make_engine(run)
        seed_everything(cfg.seed)
        learner = make_local_learner(run)
        t0 = time.perf_counter()
        batch, _ = make_collector(run, engine).collect(0, learner.version)
        t1 = time.perf_counter()
        mine, outside = score(learner, batch, learner_pass=True)
        t2 = time.perf_counter()
        truncated = top_p < 1.0 or top_k > 0
        plain = score(learner, batch, learner_pass=False)[0] if truncated else mine
        engine_lp, mask = batch["behavior_logprobs"], batch["response_mask"]
        keep = mask.bool() if outside is None else mask.bool() & ~outside
        kl = {f"kl_to_reference_{e}": float(kl_estimate(mine, plain, e)[keep].mean()) for e in ("k1", "k3")}
        row = {
            "top_p": top_p,
            "top_k": top_k,
            "generation_s": t1 - t0,
            "learner_scoring_s": t2 - t1,
            "learner": ratio_stats(mine, engine_lp, mask, outside),
            "untruncated": ratio_stats(plain, engine_lp, mask, None),
            **kl,
        }
        results.append(row)
        for name in ("learner", "untruncated"):
            s = row[name]
            print(
                f"top_p={top_p:<4g} top_k={top_k:<3d} {name:11s} tokens {s['tokens']:5d}  ratio {s['ratio_mean']:.5f}"
                f" +- {s['ratio_se_tokens']:.5f} (tokens) / {s['ratio_se_answers']:.5f} (answers)  "
                f"|log r| {s['abs_log_ratio_mean']:.5f}  r<0.99 {s['frac_ratio_below_0.99']:.3f}  "
                f"outside {s['outside_fraction']:.4f}",
                flush=True,
            )
        print(
            f"top_p={top_p:<4g} top_k={top_k:<3d} KL to the step-0 reference: k1 {kl['kl_to_reference_k1']:.5f}, "
            f"k3 {kl['kl_to_reference_k3']:.5f}",
            flush=True,
        )
        del learner
    engine.shutdown()
    out = {"label": args.label, "cpu": cpu_flags(), "machine": machine(), "args": vars(args), "cases": results}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}", flush=True)
    os._exit(0)  # skip interpreter teardown of vLLM's threads


if __name__ == "__main__":
    main()
