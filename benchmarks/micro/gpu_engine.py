"""The transformers engine and the learner on a GPU: where the time goes, and what the static-cache compile saves.

    python benchmarks/micro/gpu_engine.py generate --random-weights   # generate: dynamic KV cache vs static (compiled)
    python benchmarks/micro/gpu_engine.py profile --random-weights    # the engine and one learner step, timed, profiled

Workload: 4 prompts of 150 random tokens x 8 answers x 128 new tokens (``min_new_tokens`` where the bare
``generate`` is timed), the default step's shape. ``--model`` is an HF folder (default: the embedded
SmolLM2-135M-Instruct); ``--random-weights`` writes a random-weight model with its config and tokenizer to a
temporary folder first, so that answers run to the token cap (the numbers in benchmarks/README.md were taken
that way, on an H100). ``generate`` prints the seconds of four calls each (the first compiles); ``profile``
prints the engine's seconds per call in bf16 and fp32 with a ``torch.profiler`` table of a 16-token call, and
the median of 5 ``train_step`` calls in fp32 and under bf16 autocast, with and without shared-prompt packing,
with a profile and the kernel-launch count of each packed one. Needs CUDA; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

P, N, LP, LR = 4, 8, 150, 128


def random_weights(path: str) -> str:
    """A random-weight model with ``path``'s config and tokenizer, in a temporary folder."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(tempfile.mkdtemp(prefix="grpo-random-"))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32).save_pretrained(out)
    for f in Path(path).iterdir():
        if f.suffix in (".json", ".jinja") and f.name != "config.json":
            shutil.copy(f, out / f.name)
    return str(out)


def timed(fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(100, 40000, (LP,), generator=g).tolist() for _ in range(P)]


def generate(path: str, dev: torch.device) -> None:
    from transformers import AutoModelForCausalLM

    ids = torch.tensor(prompts()).repeat_interleave(N, 0).to(dev)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(dev).eval()

    def run(**kw) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=LR,
                min_new_tokens=LR,
                pad_token_id=2,
                **kw,
            )
        torch.cuda.synchronize()
        return time.perf_counter() - t

    for name, kw in (("dynamic", {}), ("static", dict(cache_implementation="static"))):
        print(name, " ".join(f"{run(**kw):.2f}" for _ in range(4)), "s", flush=True)


def profile(path: str, dev: torch.device) -> None:
    from torch.profiler import ProfilerActivity

    from grpo_rl.engines.base import SamplingSpec
    from grpo_rl.engines.transformers_engine import TransformersEngine
    from grpo_rl.model.loading import load_causal_lm
    from grpo_rl.training.learner import Learner, LossSettings

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    spec = SamplingSpec(max_new_tokens=LR, temperature=1.0, seed=1)
    batch = None
    for dtype in ("bfloat16", "float32"):
        eng = TransformersEngine(path, dev, dtype=dtype)
        # The timed lambdas take eng (and learner below) as defaults: each turn of the loop deletes them at its end.
        t = timed(lambda eng=eng: eng.generate(prompts(), N, spec), reps=2)
        print(
            f"engine generate {dtype}: {t:.2f} s for {P * N}x{LR} tokens ({t / LR * 1000:.1f} ms a decoding step)",
            flush=True,
        )
        batch = batch if batch is not None else eng.generate(prompts(), N, spec)
        ids = torch.tensor(prompts(), device=dev).repeat_interleave(N, 0)
        t = timed(
            lambda eng=eng, ids=ids: eng.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=LR,
                min_new_tokens=LR,
                pad_token_id=2,
            ),
            reps=2,
        )
        print(f"  bare HF generate {dtype}: {t:.2f} s", flush=True)
        with torch.profiler.profile(activities=activities) as prof:
            eng.generate(prompts(), N, SamplingSpec(max_new_tokens=16, temperature=1.0, seed=1))
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=50))
        del eng
        torch.cuda.empty_cache()

    g = torch.Generator().manual_seed(1)
    batch["advantage"] = torch.randn(P * N, generator=g)
    batch["ref_logprobs"] = batch["behavior_logprobs"].clone()
    for bf16 in (False, True):
        for share in (True, False):
            model = load_causal_lm(path, dev, "float32", trainable=True)
            learner = Learner(
                model,
                dev,
                LossSettings(kl_coef=0.01),
                lr=1e-6,
                micro_batch_tokens=4096,
                bf16_autocast=bf16,
                share_prompt=share,
            )
            t = timed(lambda learner=learner: learner.train_step(batch.clone().to(dev)))
            print(f"train_step bf16={bf16} share_prompt={share}: {t * 1000:.0f} ms", flush=True)
            if share:
                with torch.profiler.profile(activities=activities) as prof:
                    learner.train_step(batch.clone().to(dev))
                    torch.cuda.synchronize()
                averages = prof.key_averages()
                print(averages.table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=60))
                launches = sum(e.count for e in averages if e.key.startswith(("cudaLaunchKernel", "cuLaunchKernel")))
                print("kernel launches:", launches)
            del learner, model
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("generate", "profile"))
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct")
    parser.add_argument("--random-weights", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_engine.py needs a CUDA GPU")
    from grpo_rl.model.loading import resolve_model

    path = resolve_model(args.model)
    path = random_weights(path) if args.random_weights else path
    print(
        f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}; load average {os.getloadavg()}", flush=True
    )
    {"generate": generate, "profile": profile}[args.what](path, torch.device("cuda", 0))


if __name__ == "__main__":
    main()
