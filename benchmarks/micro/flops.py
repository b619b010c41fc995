"""The floating-point work a GRPO step really needs, and the matmul rate this machine reaches.

Work is counted over distinct tokens only (a group's prompt once, as prefix caching and shared-prompt packing
run it), in multiply-add pairs x 2, for a Llama-style decoder with ``config.json`` dimensions:

* per token through the decoder: ``2 * linear_params`` (q, k, v, o and the gated MLP of every layer);
* per scored position through the LM head: ``2 * d * V`` (only answer tokens, and one per prompt in generation);
* per (query, visible key) pair: ``4 * d`` per layer (``q.k`` and ``p.v``), with the pairs an answer token
  really sees (its prompt and its own past), not a dense square.

Generation: the prompt's prefill once per group plus one decoder pass per sampled token after the first.
Reference: one forward over the group's distinct tokens. Policy: forward + backward = 3 x the forward.
The embedding lookup, norms, activations, softmax and the optimizer are not matmuls and are not counted, so
the bound is a little optimistic, which is what a lower bound should be.

Two lower bounds come from this work and the rates of :func:`matmul_rates`:

* the **bound**: every FLOP at the rate of the model's matmuls over 512 rows, where a CPU's GEMM runs at its best;
* the **floor**: the same, except that decoding runs at the rate of a decoding step, whose matmuls have one row
  per sequence (16 in the TRL comparison) and read every weight of the model from memory once per sampled token.
  On a 2-core AMD EPYC (avx512_bf16, no AMX) it was about half the 512-row one: fp32 63 against 130 GFLOP/s
  (``matmul_rates``' ``fp32_decode``; ``benchmarks/README.md``, "The floor"). The
  floor is still a lower bound for autoregressive decoding: sequences that end early leave fewer rows, which is
  slower still, and attention at decode is counted at the same rate though it runs at one query row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import astuple, dataclass, fields
from pathlib import Path


@dataclass
class StepFlops:
    generation: float  # prefill + decode
    reference: float
    training: float
    tokens: float  # distinct tokens through one reference / policy pass
    decode: float = 0.0  # the part of generation fed one token per sequence per pass
    sequences: float = 0.0  # answers sampled together: the rows of a decoding step's matmuls

    @staticmethod
    def mean(items: list[StepFlops]) -> StepFlops:
        n = max(1, len(items))
        return (
            StepFlops(*(sum(values) / n for values in zip(*map(astuple, items), strict=True)))
            if items
            else StepFlops(*(0.0 for _ in fields(StepFlops)))
        )


def _dims(cfg: dict) -> tuple[int, int, int, int, int]:
    d, layers, ff, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    head_dim = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim
    linear = layers * (d * d + 2 * d * kv + d * d + 3 * d * ff)
    return d, layers, linear, vocab, ff


def step_flops(cfg: dict, groups: list[list[int]]) -> StepFlops:
    """FLOPs of one step; ``groups`` is ``[[prompt_len, answer_len, ...], ...]``."""
    d, layers, linear, vocab, _ = _dims(cfg)
    per_token, per_head, per_pair = 2 * linear, 2 * d * vocab, 4 * d * layers
    gen = decode = fwd = tokens = sequences = 0.0
    for p, *answers in groups:
        sequences += len(answers)
        prompt_pairs = p * (p + 1) / 2
        gen += p * per_token + prompt_pairs * per_pair + per_head
        n = sum(answers)
        answer_pairs = sum(a * p + a * (a + 1) / 2 for a in answers)
        # decoding: every sampled token after the first is fed back once (the last one needs no pass)
        fed = sum(max(0, a - 1) for a in answers)
        step = (
            fed * (per_token + per_head) + sum(sum(p + t + 1 for t in range(max(0, a - 1))) for a in answers) * per_pair
        )
        gen += step
        decode += step
        fwd += (p + n) * per_token + (prompt_pairs + answer_pairs) * per_pair + n * per_head
        tokens += p + n
    return StepFlops(generation=gen, reference=fwd, training=3 * fwd, tokens=tokens, decode=decode, sequences=sequences)


def bounds(flops: StepFlops, rates: dict, engine: str, train: str) -> dict:
    """The bound and the floor (module docstring), in seconds per phase; ``engine`` and ``train`` name the
    precision of generation and of the learner and reference, ``fp32`` or ``bf16``."""
    prefill = flops.generation - flops.decode
    bound = {
        "generation_s": flops.generation / rates[engine],
        "reference_s": flops.reference / rates[train],
        "training_s": flops.training / rates[train],
    }
    decode_rate = rates.get(f"{engine}_decode", rates[engine])
    floor = dict(bound, generation_s=prefill / rates[engine] + flops.decode / decode_rate)
    return {"bound": bound, "floor": floor}


def _time_best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def matmul_rates(
    cfg: dict,
    threads: int,
    tokens: int = 512,
    repeats: int = 5,
    decode_rows: int | None = None,
    precisions: tuple[str, ...] = ("fp32", "bf16"),
) -> dict:
    """Best-of-``repeats`` FLOP/s of the model's own matmul shapes at ``tokens`` rows, fp32 and bf16 (``fp32``,
    ``bf16``); with ``decode_rows``, also of one decoding step at that many rows (``fp32_decode``,
    ``bf16_decode``): every linear layer of every decoder layer, then the LM head, each weight its own tensor in
    the ``[out, in]`` layout of the models, so that the weights stream from memory as they do when decoding."""
    import torch
    import torch.nn.functional as F

    d, layers, _, vocab, ff = _dims(cfg)
    head_dim = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim
    shapes = [(tokens, d, ff), (tokens, ff, d), (tokens, d, d), (tokens, d, vocab)]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    rates = {"threads": threads}
    try:
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            if name not in precisions:  # e.g. bf16 on a CPU without bf16 matmuls: minutes for nothing
                continue
            pairs = [(torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)) for m, k, n in shapes]
            work = sum(2 * m * k * n for m, k, n in shapes)

            def large(pairs=pairs):  # bound as defaults (here and below): the names are deleted after timing
                for a, b in pairs:
                    a @ b

            rates[name] = work / _time_best(large, repeats)
            del pairs
            if decode_rows:
                per_layer = [(d, d), (kv, d), (kv, d), (d, d), (ff, d), (ff, d), (d, ff)]
                weights = [torch.randn(o, i, dtype=dtype) * 0.02 for _ in range(layers) for o, i in per_layer]
                weights.append(torch.randn(vocab, d, dtype=dtype) * 0.02)
                inputs = {i: torch.randn(decode_rows, i, dtype=dtype) for i in (d, ff)}

                def decode_step(weights=weights, inputs=inputs):
                    for w in weights:
                        F.linear(inputs[w.shape[1]], w)

                seconds = _time_best(decode_step, repeats)
                rates[f"{name}_decode"] = sum(2 * decode_rows * w.numel() for w in weights) / seconds
                rates["decode_rows"] = decode_rows
                del weights
    finally:
        torch.set_num_threads(old)
    return rates


def best_rates(
    cfg: dict, threads: int, decode_rows: int | None = None, precisions: tuple[str, ...] = ("fp32", "bf16")
) -> dict:
    """The machine's best :func:`matmul_rates`: per shape, the better of this process's and those of a fresh
    process whose OpenMP threads spin between parallel regions (``OMP_WAIT_POLICY=ACTIVE``). Our runs default to
    sleeping threads (``grpo_rl.OPENMP_DEFAULTS``), which costs an idle machine up to a third of the rate of a
    decoding step's small matmuls (2-core AMD EPYC: fp32 40-43 against 55-58 GFLOP/s); a lower bound must not
    carry that choice."""
    here = matmul_rates(cfg, threads, decode_rows=decode_rows, precisions=precisions)
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from flops import matmul_rates; "
        "print(json.dumps(matmul_rates(json.loads(sys.argv[2]), int(sys.argv[3]), "
        "decode_rows=json.loads(sys.argv[4]), precisions=tuple(json.loads(sys.argv[5])))))"
    )
    env = dict(os.environ, OMP_WAIT_POLICY="ACTIVE")
    env.pop("GOMP_SPINCOUNT", None)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(Path(__file__).resolve().parent),
            json.dumps(cfg),
            str(threads),
            json.dumps(decode_rows),
            json.dumps(list(precisions)),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    spinning = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: v if k in ("threads", "decode_rows") else max(v, spinning[k]) for k, v in here.items()}


class RateTries:
    """The machine's matmul rates measured again and again through a run (:func:`best_rates` each time: before it,
    between its rounds or points, after it), so that a floor means the same from run to run.

    One measurement is a few seconds at one moment: a worker still exiting, or anything else on a core, lowers it
    (the same point of ``scaling.py`` read fp32 150 and 106 GFLOP/s in two runs on one idle 2-core machine). The
    floor takes each rate's best try; :meth:`spread` says how far the tries lay apart.
    """

    RATES = ("fp32", "bf16", "fp32_decode", "bf16_decode")

    def __init__(self, cfg: dict, threads: int, decode_rows: int | None = None, precisions=("fp32", "bf16")):
        self.cfg, self.threads, self.decode_rows, self.precisions = cfg, threads, decode_rows, tuple(precisions)
        self.tries: list[dict] = []

    @classmethod
    def pooled(cls, many: list[RateTries], keys: tuple[str, ...]) -> RateTries:
        """The tries of ``many`` (of one model) together, for the rates ``keys`` only: the 512-row rates are the
        same shapes whatever the decoding rows, so every try of them counts."""
        out = cls(many[0].cfg, many[0].threads, precisions=many[0].precisions)
        out.tries = [{"threads": t["threads"], **{k: t[k] for k in keys if k in t}} for o in many for t in o.tries]
        return out

    def measure(self) -> dict:
        """One more try; returns it."""
        rates = best_rates(self.cfg, self.threads, decode_rows=self.decode_rows, precisions=self.precisions)
        self.tries.append(rates)
        return rates

    def best(self) -> dict:
        """Each rate's best try (``threads`` and ``decode_rows`` as measured); after one :meth:`measure` at least."""
        first = self.tries[0]
        return {k: max(t[k] for t in self.tries) if k in self.RATES else v for k, v in first.items()}

    def spread(self) -> dict:
        """Per rate: ``tries`` (FLOP/s, in order), ``best``, ``worst`` and ``best / worst``."""
        out = {}
        for k in self.RATES:
            values = [t[k] for t in self.tries if k in t]
            if values:
                out[k] = {
                    "tries": values,
                    "best": max(values),
                    "worst": min(values),
                    "ratio": max(values) / min(values),
                }
        return out

    def spread_line(self) -> str:
        """``fp32 150 (127-150, 1.18x) ...``: each rate's best and its range over the tries, in GFLOP/s."""
        parts = [
            f"{k} {s['best'] / 1e9:.0f} ({s['worst'] / 1e9:.0f}-{s['best'] / 1e9:.0f}, {s['ratio']:.2f}x)"
            for k, s in self.spread().items()
        ]
        return f"matmul rates over {len(self.tries)} tries, GFLOP/s best (range, best/worst): " + ", ".join(parts)
