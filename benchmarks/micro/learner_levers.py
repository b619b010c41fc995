"""A/B of the learner's forward/backward levers, each against its baseline interleaved in one process.

    .venv/bin/python benchmarks/micro/learner_levers.py vocab      # LM-head log-prob + entropy, fwd + bwd: old vs now
    .venv/bin/python benchmarks/micro/learner_levers.py step       # packed SmolLM2 policy fwd + bwd and reference fwd
    .venv/bin/python benchmarks/micro/learner_levers.py attention  # packed attention: dense-mask SDPA vs flex_attention
    .venv/bin/python benchmarks/micro/learner_levers.py weights    # bf16 autocast over fp32 weights vs bf16 weights
    .venv/bin/python benchmarks/micro/learner_levers.py prefix     # packed passes: dense mask vs shared-prefix parts
    .venv/bin/python benchmarks/micro/learner_levers.py fused      # q/k/v and gate/up: separate vs fused matmuls
    .venv/bin/python benchmarks/micro/learner_levers.py profile    # where one Learner.train_step's time goes, by op
    .venv/bin/python benchmarks/micro/learner_levers.py all --repeats 5

The workload is ``benchmarks/versus_trl/trl_compare.py``'s: 4 GSM8K prompts (the ``hash`` template, SmolLM2's chat
template) x 4 answers x 64 tokens, packed one row per group, SmolLM2-135M (hidden 576, 9 query / 3 key-value heads of
64, vocabulary 49152), 2 threads. Answer tokens are random ids. Each variant runs once to warm up, then the variants
alternate ``--repeats`` times (A, B, A, B, ...); the table gives the medians and their ratio. Prints the CPU, its
matmul instruction sets and the load average; writes ``benchmarks/results/learner_levers_<what>.json``. Asserts
nothing; the equality of the kept levers is tested in ``tests/unit``.

Baselines: ``vocab`` and ``step`` run the LM head as it was before its scratch buffers
(:class:`PerChunkTokenLogprob` below, a copy of that form) against :class:`grpo_rl.model.vocab.ChunkedTokenLogprob`.
``attention`` compiles ``flex_attention`` with a ``BlockMask`` of the shared-prompt layout; the CPU has no flex
backward, so it times the forward (the reference pass) and reports whether a backward runs; it also times SDPA's
forward + backward over the dense mask with the flash kernel against the math backend. ``weights`` runs the
packed policy forward + backward and the reference forward under bf16 autocast over fp32 weights (what
``train_model.precision=bfloat16`` does) against the same passes over a bf16 copy of the model without autocast,
charging the bf16 arm what fp32 master copies would add to a step: the gradients cast into fp32 and the updated
masters rounded back into the bf16 weights (the optimizer's own arithmetic is the same on both sides). It reports
how far the bf16-weight log-probs fall from the autocast ones. ``prefix`` runs the packed policy forward + backward and
the reference forward with ``train.packed_attention`` dense (SDPA over the dense packed mask) against prefix (the
three parts of :mod:`grpo_rl.model.prefix_attention`), fp32 and bf16 autocast, at group sizes 4, 8 and 16 (the
answers of 4 prompts), and reports the largest log-prob difference between the two. ``fused`` runs the same two
passes over the model as loaded against a copy with its projections fused (:mod:`grpo_rl.model.fused`).
``profile`` runs the learner's whole ``train_step`` on the micro-batch (loss, backward, gradient clipping, fused
AdamW; bf16 autocast and fp32), three times to warm up and once under ``torch.profiler``, and prints the ops by their
own CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import machine, set_threads  # noqa: E402

GROUPS, GROUP_SIZE, ANSWER = 4, 4, 64
HIDDEN, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 576, 49152, 9, 3, 64


class PerChunkTokenLogprob(torch.autograd.Function):
    """The baseline: ``grpo_rl.model.vocab.ChunkedTokenLogprob`` as it was, fresh ``[c, V]`` tensors in every chunk
    and the weight gradient summed as ``grad_weight += (gz.t() @ h).float()``; without an entropy gradient, the only
    form these runs use."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, with_entropy, chunk, entropy_grad=False):
        from grpo_rl.model.vocab import _compute_dtype

        dtype = _compute_dtype(hidden.device.type, hidden.dtype)
        w = weight.to(dtype)
        logprob = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        logz = torch.empty_like(logprob)
        entropy = torch.empty_like(logprob) if with_entropy else None
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                z = (hidden[s : s + chunk].to(dtype) @ w.t()).float()
                z = z / temperature if temperature != 1.0 else z
                lz = torch.logsumexp(z, dim=-1)
                logz[s : s + chunk] = lz
                logprob[s : s + chunk] = z.gather(-1, targets[s : s + chunk].unsqueeze(-1)).squeeze(-1) - lz
                if entropy is not None:
                    p = (z - lz.unsqueeze(-1)).exp_()
                    entropy[s : s + chunk] = lz - (p * z).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, logz)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        if entropy is not None:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        from grpo_rl.model.vocab import _logit_grad

        hidden, weight, targets, logz = ctx.saved_tensors
        dtype, chunk, temperature = ctx.dtype, ctx.chunk, ctx.temperature
        w = weight.to(dtype)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                h = hidden[s : s + chunk].to(dtype)
                z = (h @ w.t()).float()
                z = z / temperature if temperature != 1.0 else z
                g = grad_logprob[s : s + chunk].float()
                p = (z - logz[s : s + chunk].unsqueeze(-1)).exp_()
                gz = _logit_grad(p, z, g, None, targets[s : s + chunk], temperature).to(dtype)
                grad_hidden[s : s + chunk] = (gz @ w).to(hidden.dtype)
                grad_weight += (gz.t() @ h).float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None


def conditions() -> dict:
    """The CPU, its matmul instruction sets, the threads and the load average (printed with every table)."""
    info = machine()
    info["threads"] = torch.get_num_threads()
    info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    info["torch"] = torch.__version__
    return info


def alternate(variants: dict, repeats: int) -> dict[str, list[float]]:
    """Seconds of each variant: one warm-up call each, then ``repeats`` rounds of A, B, ... in turn."""
    for fn in variants.values():
        fn()
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def row(what: str, times: dict[str, list[float]], extra: dict | None = None) -> dict:
    (a, ta), (b, tb) = times.items()
    ma, mb = statistics.median(ta), statistics.median(tb)
    print(f"| {what} | {a} {ma:.3f} s | {b} {mb:.3f} s | {ma / mb:.2f}x |", flush=True)
    return {"what": what, a: ta, b: tb, "median_" + a: ma, "median_" + b: mb, "speedup": ma / mb, **(extra or {})}


def vocab(repeats: int) -> list[dict]:
    """The LM-head log-prob and entropy of every answer token of one micro-batch, forward + backward."""
    import grpo_rl.model.vocab as vocab_mod

    t = GROUPS * GROUP_SIZE * ANSWER
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(t, HIDDEN, generator=g, requires_grad=True)
    weight = (torch.randn(VOCAB, HIDDEN, generator=g) * 0.05).requires_grad_()
    targets = torch.randint(0, VOCAB, (t,), generator=g)
    chunk = vocab_mod.CHUNK_ELEMENTS // VOCAB
    out = []
    for name, bf16 in (("bf16 autocast", True), ("fp32", False)):

        def run(fn, bf16=bf16):
            hidden.grad = weight.grad = None
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                lp, ent = fn.apply(hidden, weight, targets, 1.0, True, chunk)
            lp.sum().backward()
            return lp.detach(), ent.detach(), hidden.grad, weight.grad

        before, now = run(PerChunkTokenLogprob), run(vocab_mod.ChunkedTokenLogprob)
        diffs = {
            k: float((x - y).abs().max())
            for k, x, y in zip(("logprob", "entropy", "grad_hidden", "grad_weight"), before, now, strict=True)
        }
        times = alternate(
            {"before": lambda: run(PerChunkTokenLogprob), "now": lambda: run(vocab_mod.ChunkedTokenLogprob)}, repeats
        )
        out.append(row(f"LM head fwd+bwd, {t} tokens, {name}", times, {"max_abs_diff": diffs}))
        print(f"  max |before - now|: {diffs}")
    return out


def _batch(group_size: int = GROUP_SIZE):
    """The workload's packed micro-batch (GSM8K prompts; random answer ids)."""
    from tensordict import TensorDict

    from grpo_rl.envs.data import load_records
    from grpo_rl.envs.tasks.gsm8k.env import gsm8k_messages
    from grpo_rl.model.loading import load_tokenizer, resolve_model

    path = resolve_model("embedded:smollm2-135m-instruct")
    tok = load_tokenizer(path)
    records = load_records("gsm8k", split="train")[:GROUPS]
    prompts = [
        tok.apply_chat_template(gsm8k_messages(r, template="hash"), add_generation_prompt=True, tokenize=False)
        for r in records
    ]
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    b, lp = GROUPS * group_size, max(map(len, prompts))
    prompt_ids = torch.zeros(b, lp, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    for i in range(b):
        p = prompts[i // group_size]
        prompt_ids[i, lp - len(p) :] = torch.tensor(p)
        prompt_mask[i, lp - len(p) :] = 1
    g = torch.Generator().manual_seed(0)
    batch = TensorDict(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": torch.randint(100, VOCAB, (b, ANSWER), generator=g),
            "response_mask": torch.ones(b, ANSWER, dtype=torch.long),
            "group_id": torch.arange(GROUPS).repeat_interleave(group_size),
        },
        [b],
    )
    return path, batch, [len(p) for p in prompts]


def step(repeats: int) -> list[dict]:
    """The packed policy forward + backward (with entropy) and the reference forward, LM head before vs now."""
    import grpo_rl.model.vocab as vocab_mod
    from grpo_rl.model.loading import load_causal_lm
    from grpo_rl.model.logprobs import sequence_logprobs

    path, batch, prompt_lengths = _batch()
    print(f"  prompt lengths {prompt_lengths}, {GROUP_SIZE} answers x {ANSWER} tokens each")
    model = load_causal_lm(path, torch.device("cpu"))
    current = vocab_mod.ChunkedTokenLogprob
    out = []
    for name, bf16 in (("bf16 autocast", True), ("fp32", False)):

        def policy(cls, bf16=bf16):
            vocab_mod.ChunkedTokenLogprob = cls
            try:
                model.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    res = sequence_logprobs(model, batch, with_entropy=True, share_prompt=True)
                res.logprobs.sum().backward()
            finally:
                vocab_mod.ChunkedTokenLogprob = current

        def reference(cls, bf16=bf16):
            vocab_mod.ChunkedTokenLogprob = cls
            try:
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    sequence_logprobs(model, batch, share_prompt=True)
            finally:
                vocab_mod.ChunkedTokenLogprob = current

        times = alternate({"before": lambda: policy(PerChunkTokenLogprob), "now": lambda: policy(current)}, repeats)
        out.append(row(f"packed policy fwd+bwd, {name}", times))
        times = alternate(
            {"before": lambda: reference(PerChunkTokenLogprob), "now": lambda: reference(current)}, repeats
        )
        out.append(row(f"packed reference fwd, {name}", times))
    return out


def _policy_pass(model, batch, bf16: bool, **kwargs) -> torch.Tensor:
    """The packed policy forward (with entropy) and backward; the log-probs."""
    from grpo_rl.model.logprobs import sequence_logprobs

    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        res = sequence_logprobs(model, batch, with_entropy=True, share_prompt=True, **kwargs)
    res.logprobs.sum().backward()
    return res.logprobs.detach()


def _reference_pass(model, batch, bf16: bool, **kwargs) -> torch.Tensor:
    """The packed reference forward; the log-probs."""
    from grpo_rl.model.logprobs import sequence_logprobs

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return sequence_logprobs(model, batch, share_prompt=True, **kwargs).logprobs


def prefix(repeats: int) -> list[dict]:
    """The packed policy forward + backward (with entropy) and the reference forward: dense mask vs prefix parts."""
    from grpo_rl.model.loading import load_causal_lm
    from grpo_rl.model.precision import probe_bf16

    out = []
    model = load_causal_lm(_batch()[0], torch.device("cpu"))
    probe = probe_bf16(torch.device("cpu"))
    precisions = (("bf16 autocast", True), ("fp32", False)) if probe.fast else (("fp32", False),)
    if not probe.fast:  # e.g. AVX2 alone: a bf16 matmul about 50x slower than fp32, minutes a pass
        print(f"  bf16 skipped: {probe.reason}")
    for group_size in (4, 8, 16):
        _, batch, prompt_lengths = _batch(group_size)
        print(f"  prompt lengths {prompt_lengths}, {group_size} answers x {ANSWER} tokens each")
        for name, bf16 in precisions:

            def policy(attention, bf16=bf16, batch=batch):
                return _policy_pass(model, batch, bf16, attention=attention)

            def reference(attention, bf16=bf16, batch=batch):
                return _reference_pass(model, batch, bf16, attention=attention)

            diff = float((policy("dense") - policy("prefix")).abs().max())
            extra = {"group_size": group_size, "max_abs_logprob_diff": diff}
            times = alternate({"dense": lambda: policy("dense"), "prefix": lambda: policy("prefix")}, repeats)
            out.append(row(f"G={group_size} packed policy fwd+bwd, {name}", times, extra))
            times = alternate({"dense": lambda: reference("dense"), "prefix": lambda: reference("prefix")}, repeats)
            out.append(row(f"G={group_size} packed reference fwd, {name}", times, extra))
            print(f"  max |dense - prefix| log-prob: {diff:.2e}")
    return out


def fused(repeats: int) -> list[dict]:
    """The packed policy forward + backward (with entropy) and the reference forward: q, k, v and gate, up as
    separate matmuls vs fused (grpo_rl/model/fused.py), the same weights."""
    import copy

    from grpo_rl.model.fused import fuse_projections
    from grpo_rl.model.loading import load_causal_lm
    from grpo_rl.model.precision import probe_bf16

    path, batch, prompt_lengths = _batch()
    print(f"  prompt lengths {prompt_lengths}, {GROUP_SIZE} answers x {ANSWER} tokens each")
    models = {"separate": load_causal_lm(path, torch.device("cpu"))}
    models["fused"] = copy.deepcopy(models["separate"])
    print(f"  fused groups: {fuse_projections(models['fused'])}")
    probe = probe_bf16(torch.device("cpu"))
    precisions = (("bf16 autocast", True), ("fp32", False)) if probe.fast else (("fp32", False),)
    if not probe.fast:
        print(f"  bf16 skipped: {probe.reason}")
    out = []
    for name, bf16 in precisions:

        def policy(which, bf16=bf16):
            return _policy_pass(models[which], batch, bf16)

        def reference(which, bf16=bf16):
            return _reference_pass(models[which], batch, bf16)

        diff = float((policy("separate") - policy("fused")).abs().max())
        extra = {"max_abs_logprob_diff": diff}
        times = alternate({"separate": lambda: policy("separate"), "fused": lambda: policy("fused")}, repeats)
        out.append(row(f"packed policy fwd+bwd, {name}", times, extra))
        times = alternate({"separate": lambda: reference("separate"), "fused": lambda: reference("fused")}, repeats)
        out.append(row(f"packed reference fwd, {name}", times, extra))
        print(f"  max |separate - fused| log-prob: {diff:.2e}")
    return out


def _sdpa_step(q, k, v, mask, backend):
    """SDPA forward + backward over the dense packed mask with one backend (what the policy pass runs per layer)."""
    from torch.nn.attention import sdpa_kernel

    rep = HEADS // KV_HEADS
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))

    def step():
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask
            )
        out.sum().backward()

    return step


def attention(repeats: int) -> list[dict]:
    """One layer's packed attention, ``[R, heads, S, 64]``: SDPA with the dense bool mask vs compiled flex."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from grpo_rl.model.packing import pack_groups

    _, batch, _ = _batch()
    packed = pack_groups(batch)
    r, s = packed.input_ids.shape
    dense = packed.attention_mask  # [R, 1, S, S]
    allowed = dense[:, 0]

    def mask_mod(b, h, q, k):
        return allowed[b, q, k]

    block_mask = create_block_mask(mask_mod, r, None, s, s, device="cpu")
    flex = torch.compile(flex_attention)
    g = torch.Generator().manual_seed(0)
    out = []
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        q = torch.randn(r, HEADS, s, HEAD_DIM, generator=g).to(dtype)
        k = torch.randn(r, KV_HEADS, s, HEAD_DIM, generator=g).to(dtype)
        v = torch.randn(r, KV_HEADS, s, HEAD_DIM, generator=g).to(dtype)

        def sdpa(q=q, k=k, v=v):
            rep = HEADS // KV_HEADS  # transformers' repeat_kv before SDPA with a mask on the CPU
            return F.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=dense
            )

        def flexed(q=q, k=k, v=v):
            return flex(q, k, v, block_mask=block_mask, enable_gqa=True)

        with torch.no_grad():
            t0 = time.perf_counter()
            diff = float((sdpa().float() - flexed().float()).abs().max())
            first = time.perf_counter() - t0
            times = alternate({"sdpa": sdpa, "flex": flexed}, repeats)
        try:
            flex(q.requires_grad_(), k, v, block_mask=block_mask, enable_gqa=True).sum().backward()
            backward = "runs"
        except Exception as e:  # noqa: BLE001 - the message is the finding
            backward = f"{type(e).__name__}: {e}"
        q.requires_grad_(False)
        out.append(
            row(
                f"attention fwd [{r}, {HEADS}, {s}, {HEAD_DIM}], {name}",
                times,
                {"max_abs_diff": diff, "first_call_s": first, "flex_backward": backward},
            )
        )
        print(f"  max |sdpa - flex| {diff:.2e}; first (compiling) call {first:.1f} s; flex backward: {backward}")
        out.append(
            row(
                f"attention fwd+bwd [{r}, {HEADS}, {s}, {HEAD_DIM}], {name}, SDPA backends",
                alternate(
                    {
                        "flash": _sdpa_step(q, k, v, dense, SDPBackend.FLASH_ATTENTION),
                        "math": _sdpa_step(q, k, v, dense, SDPBackend.MATH),
                    },
                    repeats,
                ),
            )
        )
    return out


def weights(repeats: int) -> list[dict]:
    """bf16 autocast over fp32 weights vs bf16 weights with fp32 master copies, policy fwd + bwd and reference fwd."""
    from grpo_rl.model.loading import load_causal_lm
    from grpo_rl.model.logprobs import sequence_logprobs

    path, batch, _ = _batch()
    model = load_causal_lm(path, torch.device("cpu"))
    low = load_causal_lm(path, torch.device("cpu")).to(torch.bfloat16)
    masters = [p.detach().float() for p in low.parameters()]

    def policy_autocast():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            res = sequence_logprobs(model, batch, with_entropy=True, share_prompt=True)
        res.logprobs.sum().backward()
        return res.logprobs.detach()

    def policy_bf16():
        low.zero_grad(set_to_none=True)
        res = sequence_logprobs(low, batch, with_entropy=True, share_prompt=True)
        res.logprobs.sum().backward()
        with torch.no_grad():
            for p, m in zip(low.parameters(), masters, strict=True):
                m.grad = p.grad.float()  # the fp32 optimizer's input
                p.copy_(m)  # its output rounded back into the bf16 weights
        return res.logprobs.detach()

    def reference(m, ac):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=ac):
            return sequence_logprobs(m, batch, share_prompt=True).logprobs

    diff = float((policy_autocast() - policy_bf16()).abs().max())
    out = [
        row(
            "packed policy fwd+bwd",
            alternate({"bf16 autocast": policy_autocast, "bf16 weights": policy_bf16}, repeats),
            {"max_abs_logprob_diff": diff},
        )
    ]
    print(f"  max |autocast - bf16 weights| log-prob: {diff:.3e}")
    out.append(
        row(
            "packed reference fwd",
            alternate(
                {"bf16 autocast": lambda: reference(model, True), "bf16 weights": lambda: reference(low, False)},
                repeats,
            ),
        )
    )
    return out


def _training_batch():
    """The workload's micro-batch with random advantages and behaviour and reference log-probs: what
    ``Learner.train_step`` takes. Returns the model's path and the batch."""
    path, batch, _ = _batch()
    g = torch.Generator().manual_seed(1)
    n, a = batch["response_ids"].shape
    batch["advantage"] = torch.randn(n, generator=g)
    batch["behavior_logprobs"] = -5 * torch.rand(n, a, generator=g)
    batch["ref_logprobs"] = -5 * torch.rand(n, a, generator=g)
    return path, batch


def _learner(path, bf16: bool):
    """A fresh ``Learner`` of the workload's model (KL 0.04, shared-prompt packing)."""
    from grpo_rl.algo.loss import LossSettings
    from grpo_rl.model.loading import load_causal_lm
    from grpo_rl.training.learner import Learner

    model = load_causal_lm(path, torch.device("cpu"), "float32", trainable=True)
    return Learner(
        model, torch.device("cpu"), LossSettings(kl_coef=0.04), lr=1e-6, bf16_autocast=bf16, share_prompt=True
    )


def profile(repeats: int) -> list[dict]:
    """One ``Learner.train_step`` on the workload's micro-batch, by op (``repeats`` is unused)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    path, batch = _training_batch()
    out = []
    for name, bf16 in (("bf16 autocast", True), ("fp32", False)):
        learner = _learner(path, bf16)
        warm = []
        for _ in range(3):
            t0 = time.perf_counter()
            learner.train_step(batch.clone())
            warm.append(time.perf_counter() - t0)
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            learner.train_step(batch.clone())
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events) / 1e6
        top = [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "calls": e.count} for e in events[:12]]
        print(
            f"| train_step, {name} | warm-up calls {', '.join(f'{x:.2f}' for x in warm)} s | profiled {total:.2f} s |"
        )
        for t in top:
            print(f"  {t['op'][:60]:60s} {t['self_s']:7.3f} s {100 * t['self_s'] / total:5.1f}%  {t['calls']} calls")
        out.append({"what": f"train_step, {name}", "warm_up_s": warm, "profiled_self_s": total, "top_ops": top})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("vocab", "step", "attention", "weights", "prefix", "fused", "profile", "all"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    todo = ("vocab", "step", "attention", "weights", "prefix", "fused") if args.what == "all" else (args.what,)
    report = {"conditions_before": conditions(), "repeats": args.repeats}
    print(f"conditions: {report['conditions_before']}")
    print("| what | A median | B median | A / B |\n|---|---|---|---|")
    for what in todo:
        levers = {
            "vocab": vocab,
            "step": step,
            "attention": attention,
            "weights": weights,
            "prefix": prefix,
            "fused": fused,
        }
        report[what] = {**levers, "profile": profile}[what](args.repeats)
    report["conditions_after"] = conditions()
    print(f"conditions after: {report['conditions_after']}")
    RESULTS.mkdir(exist_ok=True)
    dest = RESULTS / f"learner_levers_{args.what}.json"
    dest.write_text(json.dumps(report, indent=1))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
