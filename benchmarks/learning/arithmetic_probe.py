"""The base model's greedy accuracy on generated arithmetic, per problem setting: what sizes env.dataset=arithmetic.

    .venv/bin/python benchmarks/learning/arithmetic_probe.py          # the default candidates, 200 problems each
    .venv/bin/python benchmarks/learning/arithmetic_probe.py --specs add:2 add,sub:2 mul:2x1 add:3 --prompts 200
    .venv/bin/python benchmarks/learning/arithmetic_probe.py --config-name grpo_arithmetic_tools   # with the calculator

A task the model can learn in a short CPU run starts well below its ceiling but not at zero: at zero no answer in a
group is rewarded and GRPO has nothing to compare, near the ceiling there is nothing left to learn. This script
measures where each candidate lies. It composes the training config (``--config-name``, default
``config/grpo_arithmetic.yaml``: the same chat template, system prompt, reward and ``sampling.max_new_tokens``),
starts the run's vLLM engine once with the base model, and for each spec (``OPS:DIGITS`` or ``OPS:DIGITSxMUL``,
e.g. ``add,sub:2``, ``mul:2x1``) runs the training loop's own held-out evaluator (grpo_rl.rollout.evaluation: greedy
answers on the first ``--prompts`` test problems, success = the ``correct`` reward component; the override
``eval.pass_k=4`` adds sampled pass@4 and the accuracy of single samples at ``eval.temperature``, what a training
group sees). Per spec it prints greedy accuracy with a 95% Wilson interval, the mean format reward, the mean answer
length, the fraction cut at the token limit and one answer; the table names the CPU
(``grpo_rl.model.precision.cpu_flags``) and the load average. Writes ``benchmarks/results/arithmetic_probe.json``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.stats import wilson  # noqa: E402

DEFAULT_SPECS = ("add:2", "sub:2", "add,sub:2", "mul:2x1", "add:3")


def parse_spec(text: str) -> dict:
    """``add,sub:2`` -> operations [add, sub], digits 2; ``mul:2x1`` -> digits 2, mul_digits 1."""
    ops, _, digits = text.partition(":")
    first, _, second = digits.partition("x")
    return {"operations": ops.split(","), "digits": int(first), "mul_digits": int(second or 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", nargs="+", default=list(DEFAULT_SPECS))
    parser.add_argument("--prompts", type=int, default=200, help="held-out problems per spec")
    parser.add_argument("--config-name", default="grpo_arithmetic")
    parser.add_argument("--out", type=Path, default=RESULTS / "arithmetic_probe.json")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from omegaconf import OmegaConf

    from grpo_rl.api import compose
    from grpo_rl.engines.build import make_engine
    from grpo_rl.model.precision import cpu_flags
    from grpo_rl.rollout.evaluation import make_evaluator
    from grpo_rl.run.preflight import validate
    from grpo_rl.run.setup import make_run

    cfg = compose(
        args.config_name,
        [f"eval.num_prompts={args.prompts}", "eval.pass_k=0", "eval.every=1", "logger.backend=none", *args.overrides],
    )
    cfg.env.arithmetic.test_size = args.prompts  # the first problems of the test split are the same at any size
    specs = [parse_spec(s) for s in args.specs]
    for spec in specs:  # every spec must fit its sizes before the engine starts
        cfg.env.arithmetic.update(spec)
        cfg.env.arithmetic.train_size = 1
        validate(cfg)
    rows = []
    with tempfile.TemporaryDirectory(prefix="arithmetic-probe-") as tmp:
        run = make_run(cfg, Path(tmp) / "run")
        t0 = time.perf_counter()
        engine = make_engine(run)
        engine_seconds = time.perf_counter() - t0
        try:
            for text, spec in zip(args.specs, specs, strict=True):
                case = copy.deepcopy(run.cfg)  # the run's config is read-only: each spec evaluates a copy
                OmegaConf.set_readonly(case, False)
                case.env.arithmetic.update(spec)
                evaluator = make_evaluator(dataclasses.replace(run, cfg=case), engine, every=1)
                m = evaluator.evaluate()
                n = int(m["eval/num_prompts"])
                correct = round(m["eval/accuracy"] * n)
                low, high = wilson(correct, n)
                example = evaluator.last_answers[0]
                rows.append(
                    {
                        "spec": text,
                        **spec,
                        "prompts": n,
                        "accuracy": m["eval/accuracy"],
                        "wilson95": [low, high],
                        "format_mean": m.get("eval/reward_format_mean"),
                        "response_tokens_mean": m["eval/response_length_mean"],
                        "truncated_fraction": m["eval/truncated_fraction"],
                        "seconds": m["eval/seconds"],
                        **{k[5:]: v for k, v in m.items() if k.startswith(("eval/pass@", "eval/sample_"))},
                        "example": {
                            "question": example["prompt"].rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>")[0],
                            "response": example["response"],
                            "solved": example["solved"],
                        },
                    }
                )
                print(
                    f"{text:<14} acc {m['eval/accuracy']:.3f} [{low:.3f}, {high:.3f}]  format "
                    f"{m.get('eval/reward_format_mean', float('nan')):.2f}  tokens "
                    f"{m['eval/response_length_mean']:.0f}  truncated {m['eval/truncated_fraction']:.2f}  "
                    f"{m['eval/seconds']:.0f} s"
                    + "".join(
                        f"  {k[5:]} {v:.3f}" for k, v in m.items() if k.startswith(("eval/pass@", "eval/sample_"))
                    ),
                    flush=True,
                )
        finally:
            engine.shutdown()
    result = {
        "config": args.config_name,
        "overrides": args.overrides,
        "model": cfg.model.name,
        "engine": cfg.inference_model.engine,
        "precision": run.precision.inference.dtype,
        "max_new_tokens": cfg.eval.max_new_tokens or cfg.sampling.max_new_tokens,
        "cpu": cpu_flags(),
        "cores": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "engine_start_seconds": engine_seconds,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(
        f"\nCPU: {result['cpu']}, {result['cores']} cores, load average "
        f"{' '.join(f'{x:.2f}' for x in result['loadavg'])}; engine {result['engine']} ({result['precision']}), "
        f"greedy, max_new_tokens {result['max_new_tokens']}, config {args.config_name}"
    )
    print("| spec | problems | greedy accuracy | 95% Wilson | format reward | answer tokens | truncated | s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['spec']} | {r['prompts']} | {r['accuracy']:.3f} | {r['wilson95'][0]:.3f}-{r['wilson95'][1]:.3f} "
            f"| {r['format_mean'] if r['format_mean'] is not None else float('nan'):.2f} | "
            f"{r['response_tokens_mean']:.0f} | {r['truncated_fraction']:.2f} | {r['seconds']:.0f} |"
        )
    for r in rows:
        print(
            f"\n[{r['spec']}] {r['example']['question']!r} -> {r['example']['response']!r} "
            f"({'solved' if r['example']['solved'] else 'wrong'})"
        )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
