"""Micro-benchmarks behind the step-breakdown notes: the LM head and attention of one packed training micro-batch.

    .venv/bin/python benchmarks/micro/kernels.py profile    # torch.profiler table of one bf16 packed fwd + bwd
    .venv/bin/python benchmarks/micro/kernels.py lm-head    # chunked LM-head log-prob vs the plain log-softmax
    .venv/bin/python benchmarks/micro/kernels.py truncation # the chunked LM head scored under top-k / top-p vs without
    .venv/bin/python benchmarks/micro/kernels.py attention  # dense packed mask vs attention split per answer
    .venv/bin/python benchmarks/micro/kernels.py compile    # eager vs torch.compile'd decoder layers, fwd + bwd
    .venv/bin/python benchmarks/micro/kernels.py compile --dtype float32 --groups 4 --group-size 4 --prompt 150 \
        --answer 60
    .venv/bin/python benchmarks/micro/kernels.py linear-backward --groups 4 --group-size 4 --prompt 150 --answer 60

Shape (the old default step, or set with ``--groups/--group-size/--prompt/--answer``): 2 groups, prompt 300 tokens
+ 8 answers x 140 tokens, SmolLM2-135M shapes (hidden 576, 9 heads of 64, vocabulary 49152), bf16 autocast,
2 threads. ``--groups 4 --group-size 4 --prompt 240 --answer 64`` is the TRL-comparison step. Prints seconds;
asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

GROUPS, G, PROMPT, ANSWER = 2, 8, 300, 140
ROUNDS = 5
AUTOCAST = True  # bf16 autocast (--dtype bfloat16) or plain fp32 (--dtype float32) in the packed step
HIDDEN, HEADS, HEAD_DIM, VOCAB, LAYERS = 576, 9, 64, 49152, 30


def timed(fn, repeats: int = 2) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def _packed_step():
    """The real model, and one bf16 packed training forward + backward over a random batch of the set shape."""
    from tensordict import TensorDict

    from grpo_rl.model.loading import load_causal_lm, resolve_model
    from grpo_rl.model.logprobs import packed_sequence_logprobs

    model = load_causal_lm(resolve_model("embedded:smollm2-135m-instruct"), torch.device("cpu"))
    b = GROUPS * G
    prompt = torch.randint(100, 40000, (GROUPS, PROMPT)).repeat_interleave(G, 0)
    batch = TensorDict(
        {
            "prompt_ids": prompt,
            "prompt_mask": torch.ones(b, PROMPT, dtype=torch.long),
            "response_ids": torch.randint(100, 40000, (b, ANSWER)),
            "response_mask": torch.ones(b, ANSWER, dtype=torch.long),
            "group_id": torch.arange(GROUPS).repeat_interleave(G),
        },
        [b],
    )

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AUTOCAST):
            out = packed_sequence_logprobs(model, batch, with_entropy=True)
        out.logprobs.sum().backward()

    return model, step


def profile() -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    _, step = _packed_step()
    print(f"packed fwd + bwd: {timed(step, 1):.2f} s")
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def lm_head() -> None:
    from grpo_rl.model.vocab import ChunkedTokenLogprob

    tokens = GROUPS * G * ANSWER
    hidden = torch.randn(tokens, HIDDEN, requires_grad=True)
    weight = (torch.randn(VOCAB, HIDDEN) * 0.02).requires_grad_()
    targets = torch.randint(0, VOCAB, (tokens,))

    def plain():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = (hidden @ weight.t()).float()
            logz = torch.logsumexp(z, -1)
            logprob = z.gather(-1, targets[:, None])[:, 0] - logz
            with torch.no_grad():
                (logz - (torch.softmax(z, -1) * z).sum(-1)).sum()
        logprob.sum().backward()

    def chunked(chunk):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logprob, _ = ChunkedTokenLogprob.apply(hidden, weight, targets, 1.0, True, chunk)
        logprob.sum().backward()

    print(f"{tokens} tokens, fwd + bwd")
    print(f"plain           {timed(plain):.2f} s")
    for chunk in (128, (1 << 24) // VOCAB, 1024):
        print(f"chunk {chunk:5d}     {timed(lambda chunk=chunk: chunked(chunk)):.2f} s")


def truncation() -> None:
    """The chunked LM head's fwd + bwd (with the entropy, as the learner asks) without truncation and under top-k,
    top-p and both, in fp32 and under bf16 autocast, on SmolLM2's hidden states of GSM8K text (real next-token
    distributions: how many rows top-p keeps beyond the candidates depends on them); then the kept-set search alone,
    per chunk, on those logits and on flat ones (every row sorted whole: the worst case)."""
    from grpo_rl.envs.data import load_records
    from grpo_rl.model.loading import load_causal_lm, load_tokenizer, resolve_model
    from grpo_rl.model.vocab import (
        CHUNK_ELEMENTS,
        TOP_P_CANDIDATES,
        ChunkedTokenLogprob,
        TruncatedTokenLogprob,
        truncation_threshold,
    )

    tokens = GROUPS * G * ANSWER
    path = resolve_model("embedded:smollm2-135m-instruct")
    model, tok = load_causal_lm(path, torch.device("cpu")), load_tokenizer(path)
    ids: list[int] = []
    for rec in load_records("gsm8k", split="train"):
        ids += tok(rec["question"] + "\n" + rec["answer"] + "\n")["input_ids"]
        if len(ids) >= tokens + 1:
            break
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=torch.tensor([ids[:tokens]])).last_hidden_state[0]  # [T, H]
    weight = model.get_output_embeddings().weight.detach().clone().requires_grad_()
    hidden.requires_grad_()
    targets = torch.tensor(ids[1 : tokens + 1])
    vocab = weight.shape[0]
    chunk = CHUNK_ELEMENTS // vocab

    def run(top_p, top_k, bf16):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if top_p < 1.0 or top_k > 0:
                logprob = TruncatedTokenLogprob.apply(hidden, weight, targets, 1.0, True, chunk, False, top_p, top_k)[0]
            else:
                logprob = ChunkedTokenLogprob.apply(hidden, weight, targets, 1.0, True, chunk)[0]
        logprob.sum().backward()

    print(
        f"{tokens} tokens of GSM8K text, vocabulary {vocab}, chunks of {chunk}; fwd + bwd, seconds "
        f"(median of {ROUNDS} rounds, the cases alternated within each)"
    )
    cases = [("none", 1.0, 0), ("top_k=50", 1.0, 50), ("top_p=0.9", 0.9, 0), ("top_p=0.9 top_k=50", 0.9, 50)]
    arms = [(bf16, *case) for bf16 in (False, True) for case in cases]
    for arm in arms:
        run(*arm[2:], arm[0])  # warm-up
    times: dict[tuple, list[float]] = {arm: [] for arm in arms}
    for _ in range(ROUNDS):
        for bf16, name, top_p, top_k in arms:
            t0 = time.perf_counter()
            run(top_p, top_k, bf16)
            times[(bf16, name, top_p, top_k)].append(time.perf_counter() - t0)
    for bf16, name, top_p, top_k in arms:
        t = sorted(times[(bf16, name, top_p, top_k)])[ROUNDS // 2]
        base = sorted(times[(bf16, "none", 1.0, 0)])[ROUNDS // 2]
        print(f"{'bf16' if bf16 else 'fp32'} {name:20s} {t:6.2f}  ({t / base:.2f}x)")
    with torch.no_grad():
        z = (hidden[:chunk] @ weight.t()).float()
    kept = (z >= truncation_threshold(z, 0.9, 0).unsqueeze(-1)).sum(-1)
    small, large = TOP_P_CANDIDATES
    print(
        f"top_p=0.9 keeps {kept.float().median():.0f} tokens (median), {int(kept.max())} at most; rows beyond "
        f"{small} candidates {float((kept >= small).float().mean()):.1%}, beyond {large} "
        f"{float((kept >= large).float().mean()):.1%}"
    )
    flat = torch.randn(chunk, vocab, generator=torch.Generator().manual_seed(0))
    for label, logits in (("GSM8K", z), ("flat", flat)):
        for name, top_p, top_k in cases[1:]:
            t = timed(lambda logits=logits, top_p=top_p, top_k=top_k: truncation_threshold(logits, top_p, top_k), 5)
            print(
                f"kept set only, {label:5s} {name:20s} {t * 1e3:7.1f} ms per chunk of {chunk} "
                f"({t * tokens / chunk:.2f} s per {tokens} tokens)"
            )
    full = timed(lambda: z.sort(dim=-1), 3)
    print(
        f"a full sort of a chunk, for comparison: {full * 1e3:.1f} ms "
        f"({full * tokens / chunk:.2f} s per {tokens} tokens)"
    )


def attention() -> None:
    dt, s = torch.bfloat16, PROMPT + G * ANSWER

    def leaf(*shape):
        return torch.randn(*shape, dtype=dt, requires_grad=True)

    q, k = leaf(GROUPS, HEADS, s, HEAD_DIM), leaf(GROUPS, HEADS, s, HEAD_DIM)
    segment = torch.cat([torch.zeros(PROMPT, dtype=torch.long)] + [torch.full((ANSWER,), i + 1) for i in range(G)])
    idx = torch.arange(s)
    dense_mask = (idx[:, None] >= idx[None, :]) & ((segment[None, :] == 0) | (segment[None, :] == segment[:, None]))
    qp, kp = leaf(GROUPS, HEADS, PROMPT, HEAD_DIM), leaf(GROUPS, HEADS, PROMPT, HEAD_DIM)
    qa, ka = leaf(GROUPS * G, HEADS, ANSWER, HEAD_DIM), leaf(GROUPS * G, HEADS, PROMPT + ANSWER, HEAD_DIM)
    i, j = torch.arange(ANSWER)[:, None], torch.arange(PROMPT + ANSWER)[None, :]
    answer_mask = (j < PROMPT) | (j - PROMPT <= i)  # the whole prompt, then causal within the answer

    def dense():
        F.scaled_dot_product_attention(q, k, k, attn_mask=dense_mask).sum().backward()

    def split():
        F.scaled_dot_product_attention(qp, kp, kp, is_causal=True).sum().backward()
        F.scaled_dot_product_attention(qa, ka, ka, attn_mask=answer_mask).sum().backward()

    print(
        f"fwd + bwd over {LAYERS} layers: dense {timed(dense, 3) * LAYERS:.2f} s, "
        f"split {timed(split, 3) * LAYERS:.2f} s"
    )
    for dtype in (torch.bfloat16, torch.float32):  # the kernel's own speed: plain causal attention, no mask
        qc = torch.randn(GROUPS, HEADS, s, HEAD_DIM, dtype=dtype, requires_grad=True)
        causal = timed(lambda qc=qc: F.scaled_dot_product_attention(qc, qc, qc, is_causal=True).sum().backward(), 3)
        print(f"plain causal, {str(dtype).removeprefix('torch.')}: {causal * LAYERS:.2f} s")


def linear_backward() -> None:
    """The rate of the decoder's linear layers at the training pass's token count (``GROUPS x (PROMPT + G x
    ANSWER)`` rows: the distinct tokens of a packed batch), forward alone against forward + backward (3x the
    forward's FLOPs), in fp32, with bf16 weights, and under bf16 autocast over fp32 weights: whether the backward's
    matmuls run as fast as the forward's, which the bound of ``flops.py`` assumes."""
    rows = GROUPS * (PROMPT + G * ANSWER)
    per_layer = [
        (HIDDEN, HIDDEN),
        (192, HIDDEN),
        (192, HIDDEN),
        (HIDDEN, HIDDEN),
        (1536, HIDDEN),
        (1536, HIDDEN),
        (HIDDEN, 1536),
    ]
    for mode in ("fp32", "bf16 weights", "bf16 autocast"):
        dtype = torch.bfloat16 if mode == "bf16 weights" else torch.float32
        weights = [(torch.randn(o, i, dtype=dtype) * 0.02).requires_grad_() for _ in range(4) for o, i in per_layer]
        inputs = {i: torch.randn(rows, i, dtype=dtype, requires_grad=True) for i in (HIDDEN, 1536)}
        flops = sum(2 * rows * w.numel() for w in weights)
        autocast = mode == "bf16 autocast"

        # the loop's tensors bound as defaults (B023), although each function is timed within its own turn
        def forward(weights=weights, inputs=inputs, autocast=autocast):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                for w in weights:
                    F.linear(inputs[w.shape[1]], w)

        def forward_backward(weights=weights, inputs=inputs, autocast=autocast):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                outs = [F.linear(inputs[w.shape[1]], w) for w in weights]
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            for t in (*weights, *inputs.values()):
                t.grad = None

        fwd, both = timed(forward, 3), timed(forward_backward, 3)
        print(
            f"{mode:14s} {rows} rows: forward {flops / fwd / 1e9:5.0f} GFLOP/s, forward + backward "
            f"{3 * flops / both / 1e9:5.0f} GFLOP/s"
        )


def compiled() -> None:
    """The packed fwd + bwd with every decoder layer under ``torch.compile(dynamic=True)`` against eager,
    alternated (the first steps of a process are slower, so measuring one after the other would favour the second)."""
    model, step = _packed_step()
    layers = model.get_decoder().layers
    step()  # eager warm-up
    for layer in layers:
        layer.compile(dynamic=True)
    compiled_calls = [layer._compiled_call_impl for layer in layers]
    t0 = time.perf_counter()
    step()
    print(f"first compiled call {time.perf_counter() - t0:.1f} s")
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(3):
        for name in times:
            for layer, call in zip(layers, compiled_calls, strict=True):
                layer._compiled_call_impl = call if name == "compiled" else None
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    print(
        "packed fwd + bwd, alternated: "
        + ", ".join(
            f"{name} {' '.join(f'{t:.2f}' for t in ts)} s (mean {sum(ts) / len(ts):.2f})" for name, ts in times.items()
        )
    )


def main() -> None:
    global GROUPS, G, PROMPT, ANSWER, AUTOCAST
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["profile", "lm-head", "truncation", "attention", "compile", "linear-backward"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--groups", type=int, default=GROUPS)
    parser.add_argument("--group-size", type=int, default=G)
    parser.add_argument("--prompt", type=int, default=PROMPT)
    parser.add_argument("--answer", type=int, default=ANSWER)
    parser.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="the packed step (profile, compile): bf16 autocast or plain fp32",
    )
    args = parser.parse_args()
    GROUPS, G, PROMPT, ANSWER = args.groups, args.group_size, args.prompt, args.answer
    AUTOCAST = args.dtype == "bfloat16"
    torch.set_num_threads(args.threads)
    {
        "profile": profile,
        "lm-head": lm_head,
        "truncation": truncation,
        "attention": attention,
        "compile": compiled,
        "linear-backward": linear_backward,
    }[args.what]()


if __name__ == "__main__":
    main()
