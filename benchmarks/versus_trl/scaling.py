"""Our synchronous GRPO step against TRL's ``GRPOTrainer`` and against its floor, over group size, answer length,
prompts per step and model size.

    bash benchmarks/versus_trl/setup_trl_env.sh                  # once: TRL's own venv in benchmarks/.venv-trl
    .venv/bin/python benchmarks/versus_trl/scaling.py --dry-run  # the plan and its estimated time, runs nothing
    .venv/bin/python benchmarks/versus_trl/scaling.py            # the 7 points, 1 warm-up + 1 timed step per arm
    .venv/bin/python benchmarks/versus_trl/scaling.py --axes model --models 135m,360m --steps 2
    .venv/bin/python benchmarks/versus_trl/scaling.py --axes group,length,prompts --sides ours   # ours, its floor
    .venv/bin/python benchmarks/versus_trl/scaling.py --plot-only benchmarks/results/scaling-TIME.json --png FIGURE.png
    .venv/bin/python benchmarks/versus_trl/scaling.py --smoke --sides ours,trl   # plumbing: a tiny model, one point

The grid, one factor at a time around a shared base point (the 135M shape, group size 4, 64-token answers):

* group size 4, 8, 16 (135M shape, 64 tokens);
* answer length 64, 128, 256 tokens (135M shape, group size 4);
* prompts per step 1, 2, 4 (135M shape, group size 4, 64 tokens; ``--prompts-per-step`` is the other points');
* model size: random-weight models with the shapes of SmolLM2-135M and SmolLM2-360M, and a ~1B model
  (group size 4, 64 tokens).

The base point is shared, so the full grid is 9 points (``--axes`` defaults to the first three axes' 7). ``--axes``
picks axes, ``--models`` the model-size axis's models (the other two axes always run at the 135M shape).

Workload: trl_compare.py's at equal precision, ``ours:fp32`` against ``trl:fp32`` (fp32 weights, activations
and engine on both sides), the same GSM8K prompts in the same order (``prepare_prompts`` at the chosen
``--prompts-per-step``, default 2 rather than the 4 of trl_compare.py to keep the large points affordable), the
same reward (correctness + '#### N' format + brevity), temperature 1.0, KL 0.04 against a reference model, lr
1e-6, seed 0. Our side runs with ``inference_model.kv_cache_gb`` sized for prompts x G x (320 + answer) tokens
(more than the prompts x (prompt + G x answer) that prefix caching needs; at least trl_compare's 0.25 GiB, which
the base point keeps) and ``inference_model.max_model_len`` = 320 prompt tokens + the answer length.

The models are random (``initializer_range`` 0.02) with the SmolLM2 tokenizer and vocabulary (49152), written once
to ``benchmarks/results/scaling-models/<name>`` (``1b-<N>l`` at another ``--large-layers``) and reused. Random
weights give a next-token distribution close to uniform over the vocabulary, so the end token comes about once in
50,000 tokens: every answer runs to the length cap, which makes the answer length exact (the tables print the
completion tokens per step to show it; the smoke run's TRL log shows a clipped ratio of 1 and an entropy of 10.79
nats, against ln 49152 = 10.80). Shapes (head dimension 64 everywhere: vLLM's CPU attention supports 32, 64,
128...; tied embeddings):

* ``135m``: SmolLM2-135M, hidden 576, 30 layers, 9 heads, 3 KV heads, MLP 1536: 134.5M parameters;
* ``360m``: SmolLM2-360M, hidden 960, 32 layers, 15 heads, 5 KV heads, MLP 2560: 361.8M parameters;
* ``1b``: SmolLM2-1.7B's layer (hidden 2048, 32 heads, 32 KV heads, MLP 8192), 10 of its 24 layers:
  771.8M parameters (``--large-layers`` changes the depth: 67.1M per layer + 100.7M embedding).

Why 0.77B and not 1B: the machine has 24 GiB (23.5 GiB MemTotal) and one worker process is alive at a time. Our
worker holds fp32 weights + gradients + two AdamW moments (16 bytes per parameter), the reference copy (4) and the
vLLM engine's copy (4): 24 bytes per parameter, 17.3 GiB at 0.77B; on top of that about 1.5 GiB of runtime, engine
buffers and KV cache (0.54 GiB: 160 KiB per token in fp32) and the activations of one micro-batch (no gradient
checkpointing: about 2.5 GiB for the 2 x (prompt + 4 x 64) = ~800 distinct tokens of the 1B point, scaled from the
135M measurements of memory_breakdown.py by the layer's width x depth), about 21.3 GiB in all, next to this
orchestrator (~0.4 GiB) and the system. TRL holds weights, gradients, moments and its reference (20 bytes per
parameter, 14.4 GiB) plus logits and checkpointed activations (``gradient_checkpointing`` is on by default in
GRPOConfig): about 17 GiB. 11 layers (0.84B, ~23 GiB on our side) would leave no margin, 1.07B (16 layers) needs
~27 GiB. So our side's third and fourth copy of the weights (reference, engine) set the limit. These are
estimates: the 1B point has not been run on this machine; if a worker is killed for memory, the point records the
error and the run goes on (``--large-layers 9`` gives 0.70B).

Every point runs its arms one after the other in fresh processes (ours, then TRL; ``run_round`` of
trl_compare.py with one arm), never two workers at once, so the large model fits; trl_compare.py alternates
arms step by step instead, which this script cannot afford in memory. So load changes between the arms of a
point are not balanced out here: the load average is printed before every point and stored. Each arm does
``--warmup`` untimed steps then ``--steps`` timed steps; start-up is not timed.

Printed: the CPU and load average at the start and per point; per axis a table of ours and TRL's s/step, the
ratio TRL / ours, peak RSS of each worker, completion tokens per step, and ours' step against its matmul bound
(flops.py, with the matmul rate measured here for each model's shapes) and its floor (the bound with decoding
charged at the rate of one decoding step at the point's prompts x G rows, as trl_compare.py does); the phases of every
point; and where the ratio shrinks along an axis, which phases grew on each side (the "why" to write up). Written:
``benchmarks/results/scaling-<time>.json`` (machine, command, models, matmul rates, every point with trl_compare's
per-arm summaries; rewritten after every point, so a run cut short keeps its finished points) and
``benchmarks/results/scaling-<time>.png`` (matplotlib: one column per axis, s/step of both sides on a log scale above
with ours' floor dotted, the ratio below). ``--plot-only JSON`` redraws the figure (and reprints the tables) from a JSON
file. Never asserts a time.

Time: estimated from the step times of benchmarks/README.md (135M, 4 prompts x 4 answers x 64 tokens, 2 threads,
fp32: TRL ~60 s/step, ours ~20 s/step) scaled by each side's matmul FLOPs (ours: distinct tokens, the prompt once
per group; TRL: every answer with its own prompt copy), plus start-up. At the defaults (2 prompts per step, 1
warm-up + 1 timed step, 2 threads) that gives about 35 minutes (TRL ~30 s/step at the base point, ~120 s at
G=16, ~180 s at 1B; ours ~10, ~31 and ~57 s), most of it TRL's arms; ``--steps 3`` about an hour; ``--dry-run``
prints the estimate of any selection. The same FLOP model predicts the ratio: it grows with the group size (TRL
runs a group's prompt once per answer, we run it once per group: 3.0 -> 3.9 at G=16), holds with model size, and
shrinks with the answer length (3.0 -> 2.0 at 256 tokens), because the prompt that packing and prefix caching
save is a smaller share of a step whose answers are long. Measured ratios add what FLOPs leave out (vLLM's
per-token decode overhead against ``generate``'s, attention kernels, TRL's gradient checkpointing).

``--smoke`` checks the plumbing only (model building, both workers, the protocol, JSON, the figure) on a tiny
random model (hidden 64, 2 layers, 2 heads of 32) at one point, 0 warm-up + 1 timed step, 1 thread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import machine  # noqa: E402
from benchmarks.common.workload import WORKLOAD  # noqa: E402
from benchmarks.micro.flops import step_flops  # noqa: E402
from benchmarks.versus_trl.trl_compare import TRL_PYTHON, Arm, parse_arm  # noqa: E402

SMOLLM2_VOCAB = 49152  # the SmolLM2 tokenizer's size; the built models take it from the tokenizer itself
MAX_PROMPT_TOKENS = 320  # env.max_prompt_tokens of config/grpo_gsm8k.yaml
EST_PROMPT_TOKENS = 150  # a GSM8K prompt with its chat template, for the time estimate only

# Architecture of each model: hidden size, layers, heads, KV heads, MLP width (head dimension = hidden / heads).
SHAPES = {
    "135m": dict(
        hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536
    ),
    "360m": dict(
        hidden_size=960, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5, intermediate_size=2560
    ),
    # SmolLM2-1.7B's layer, fewer of them (its 24 layers would be 1.71B); --large-layers sets the count
    "1b": dict(
        hidden_size=2048, num_hidden_layers=10, num_attention_heads=32, num_key_value_heads=32, intermediate_size=8192
    ),
    # --smoke only
    "tiny": dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, intermediate_size=128
    ),
}
DEFAULT_LARGE_LAYERS = SHAPES["1b"]["num_hidden_layers"]
AXES = ("group", "length", "model", "prompts")
DEFAULT_AXES = ("group", "length", "model")
AXIS_VALUES = {"group": (4, 8, 16), "length": (64, 128, 256), "prompts": (1, 2, 4)}
BASE = dict(model="135m", group=4, length=64)
AXIS_TITLE = {
    "group": "group size",
    "length": "answer length (tokens)",
    "model": "model size (parameters)",
    "prompts": "prompts per step",
}
AXIS_KEY = {"group": "group_size", "length": "answer_tokens", "model": "params", "prompts": "prompts_per_step"}

# benchmarks/README.md, machine B, 2 threads, 135M, 4 prompts x 4 answers x 64 tokens, fp32 (rounded)
REF_SECONDS = {"ours": 20.0, "trl": 60.0}
REF_POINT = dict(prompts=4, group=4, length=64)
STARTUP_S = {"ours": 35.0, "trl": 25.0}  # process start to 'ready' at 135M; larger models add their loading
LOAD_S_PER_GB = {"ours": 6.0, "trl": 4.0}  # three copies (engine, learner, reference) vs two


def shape_config(name: str, vocab: int = SMOLLM2_VOCAB) -> dict:
    s = dict(SHAPES[name])
    s["head_dim"] = s["hidden_size"] // s["num_attention_heads"]
    s["vocab_size"] = vocab
    return s


def param_count(cfg: dict) -> int:
    """Parameters of a Llama with tied embeddings: embedding + per layer (q, k, v, o, gated MLP, 2 norms) + norm."""
    d, layers, ff, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * ff + 2 * d
    return v * d + layers * per_layer + d


def fmt_params(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


# ---------------------------------------------------------------------------------------------------- the plan


@dataclass
class Point:
    model: str
    group: int
    length: int
    prompts: int
    axes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.model} G={self.group} L={self.length} P={self.prompts}"

    @property
    def slug(self) -> str:
        return f"{self.model}-G{self.group}-L{self.length}-P{self.prompts}"


def plan(axes: list[str], models: list[str], base: dict) -> list[Point]:
    """The distinct points of the selected axes, the shared base point once, each knowing its axes."""
    points: dict[tuple, Point] = {}

    def add(axis: str, model: str, group: int, length: int, prompts: int) -> None:
        p = points.setdefault((model, group, length, prompts), Point(model, group, length, prompts))
        if axis not in p.axes:
            p.axes.append(axis)

    m, g, n, k = base["model"], base["group"], base["length"], base["prompts"]
    for axis in axes:
        if axis == "group":
            for x in AXIS_VALUES["group"]:
                add(axis, m, x, n, k)
        elif axis == "length":
            for x in AXIS_VALUES["length"]:
                add(axis, m, g, x, k)
        elif axis == "prompts":
            for x in AXIS_VALUES["prompts"]:
                add(axis, m, g, n, x)
        else:
            for x in models:
                add(axis, x, g, n, k)
    return list(points.values())


def _step_flops_total(cfg: dict, groups: list[list[int]]) -> float:
    f = step_flops(cfg, groups)
    return f.generation + f.reference + f.training


def estimate_s_per_step(cfg: dict, prompts: int, group: int, length: int) -> dict:
    """Seconds per step of each side, scaled from README's 135M step times by the matmul FLOPs.

    Ours: a group's prompt once (prefix caching, shared-prompt packing). TRL: every answer with its own prompt
    copy (``generate`` over prompts x G rows; unpacked reference and policy passes).
    """
    ref_cfg = shape_config("135m")

    def ours(c, p, g, n):
        return _step_flops_total(c, [[EST_PROMPT_TOKENS] + [n] * g for _ in range(p)])

    def trl(c, p, g, n):
        return _step_flops_total(c, [[EST_PROMPT_TOKENS, n] for _ in range(p * g)])

    r = REF_POINT
    return {
        side: REF_SECONDS[side] * fn(cfg, prompts, group, length) / fn(ref_cfg, r["prompts"], r["group"], r["length"])
        for side, fn in (("ours", ours), ("trl", trl))
    }


def estimate(points: list[Point], cfgs: dict, steps: int, sides: list[str]) -> tuple[list[dict], float]:
    rows, total = [], 0.0
    for p in points:
        per = estimate_s_per_step(cfgs[p.model], p.prompts, p.group, p.length)
        gb = 4 * param_count(cfgs[p.model]) / 1e9
        row = {"point": p.name}
        for side in sides:
            seconds = STARTUP_S[side] + LOAD_S_PER_GB[side] * gb + steps * per[side]
            row[side] = per[side]
            row[f"{side}_total"] = seconds
            total += seconds
        rows.append(row)
    return rows, total


# ---------------------------------------------------------------------------------------------------- models


def build_model(name: str, target: Path, shape: dict) -> None:
    """Write a random-weight Llama of ``shape`` with the SmolLM2 tokenizer to ``target`` (run in a subprocess)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from grpo_rl.model.loading import resolve_model

    tok_path = resolve_model(WORKLOAD["model"])
    tok = AutoTokenizer.from_pretrained(tok_path)
    # SmolLM2-135M's own config (rope, norm epsilon, special tokens, 8192 positions), resized
    config = AutoConfig.from_pretrained(tok_path)
    for key, value in shape.items():
        setattr(config, key, value)
    config.vocab_size = len(tok)
    config.initializer_range = 0.02
    config.tie_word_embeddings = True
    config.use_cache = True
    torch.manual_seed(0)
    t = time.perf_counter()
    model = LlamaForCausalLM(config).to(torch.float32)
    n = sum(p.numel() for p in model.parameters())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".tmp-{name}-"))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "scaling_shape.json").write_text(json.dumps({"name": name, "shape": shape, "params": n}))
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    print(f"built {name}: {n:,} parameters in {time.perf_counter() - t:.1f} s -> {target}", flush=True)


def ensure_model(name: str, shape: dict, root: Path, threads: int) -> tuple[Path, dict]:
    """The cached model folder of ``name`` (built in a subprocess when missing or of another shape)."""
    target = root / name
    meta = target / "scaling_shape.json"
    if not (
        meta.exists()
        and any(target.glob("*.safetensors"))  # one file, or shards
        and json.loads(meta.read_text()).get("shape") == shape
    ):
        print(f"building the random {name} model ({fmt_params(param_count(shape))}) in {target} ...", flush=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--build-model",
                name,
                "--build-shape",
                json.dumps(shape),
                "--model-root",
                str(root),
            ],
            check=True,
            env=env,
        )
    cfg = json.loads((target / "config.json").read_text())
    cfg["params"] = json.loads(meta.read_text())["params"]
    return target, cfg


# ---------------------------------------------------------------------------------------------------- running


def kv_cache_gb(cfg: dict, prompts: int, group: int, length: int) -> float:
    """fp32 KV cache for prompts x G x (longest prompt + answer + a 16-token block) tokens, 10% margin, at least
    trl_compare's 0.25 GiB.

    Prefix caching needs only prompts x (prompt + G x answer); this also holds every answer with its own copy of
    the prompt, should the engine prefill a group's answers before their shared blocks are cached, so no sequence
    ever waits for room. vLLM zero-fills the whole cache at start, so it is resident: 0.54 GiB at the 1B point,
    0.61 GiB at 135M x G=16.
    """
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
    tokens = prompts * group * (MAX_PROMPT_TOKENS + length + 16)
    return max(0.25, round(1.1 * tokens * per_token / 2**30 + 0.005, 2))


def ours_arm(model_dir: Path, cfg: dict, p: Point, overrides: Sequence[str] = ()) -> Arm:
    base = parse_arm("ours:fp32")  # trl_compare's preset: fp32 everywhere, shared-prompt packing
    extra = [
        f"model.name={model_dir}",
        f"env.prompts_per_step={p.prompts}",
        f"env.group_size={p.group}",
        f"sampling.max_new_tokens={p.length}",
        f"inference_model.max_model_len={MAX_PROMPT_TOKENS + p.length}",
        f"inference_model.kv_cache_gb={kv_cache_gb(cfg, p.prompts, p.group, p.length)}",
        *overrides,
    ]
    merged = dict(o.split("=", 1) for o in base.overrides + extra)  # later wins
    return Arm("ours", "fp32", [f"{k}={v}" for k, v in merged.items()])


def load_line() -> str:
    a, b, c = os.getloadavg()
    return f"load average {a:.2f} {b:.2f} {c:.2f}"


def run_point(
    p: Point, args, model_dir: Path, cfg: dict, rates: dict, prompts_path: Path, log_dir: Path
) -> tuple[dict, dict]:
    """One point, each side in turn: its record, and the arms (summarized again at the end with the rates' best
    tries)."""
    from benchmarks.versus_trl.trl_compare import run_round, summarize

    point_dir = log_dir / p.slug
    point_dir.mkdir(parents=True, exist_ok=True)
    trl_args = ["--group-size", str(p.group), "--max-new-tokens", str(p.length), "--prompts-per-step", str(p.prompts)]
    arms = {"ours": ours_arm(model_dir, cfg, p, args.ours_overrides), "trl": parse_arm("trl:fp32")}
    out = {
        "point": p.name,
        "model": p.model,
        "params": cfg["params"],
        "group_size": p.group,
        "answer_tokens": p.length,
        "prompts_per_step": p.prompts,
        "axes": p.axes,
        "load_before": os.getloadavg(),
        "rounds": {},
        "errors": {},
    }
    for side in args.sides:  # one worker alive at a time: ours, then TRL
        arm = arms[side]
        t = time.perf_counter()
        try:
            out["rounds"][side] = run_round([arm], args, prompts_path, str(model_dir), point_dir, trl_args=trl_args)
        except Exception as e:  # an arm that dies (e.g. out of memory) is recorded; the run goes on
            out["errors"][side] = f"{type(e).__name__}: {e}"[-4000:]
            print(f"  {arm.name} FAILED: {str(e)[-1500:]}", flush=True)
        out[f"{side}_wall_s"] = time.perf_counter() - t
        out[side] = summarize(arm, args.warmup, rates, cfg) if len(arm.steps) > args.warmup else None
    out["load_after"] = os.getloadavg()
    if out.get("ours") and out.get("trl"):
        out["ratio"] = out["trl"]["s_per_step"] / out["ours"]["s_per_step"]
    return out, arms


# ---------------------------------------------------------------------------------------------------- report


def _get(point: dict, side: str, key: str, default=None):
    s = point.get(side)
    return s.get(key, default) if s else default


def _f(x, spec: str, width: int) -> str:
    return f"{x:{width}{spec}}" if isinstance(x, (int, float)) else f"{'-':>{width}s}"


def axis_points(result: dict, axis: str) -> list[dict]:
    pts = [p for p in result["points"] if axis in p["axes"]]
    return sorted(pts, key=lambda p: p[AXIS_KEY[axis]])


def print_tables(result: dict) -> None:
    for axis in AXES:
        pts = axis_points(result, axis)
        if not pts:
            continue
        print(f"\n{AXIS_TITLE[axis]}")
        print(
            f"{'point':24s} {'params':>7s} {'ours s/step':>11s} {'TRL s/step':>10s} {'TRL/ours':>8s} "
            f"{'ours RSS':>8s} {'TRL RSS':>7s} {'tok/step ours':>13s} {'TRL':>5s} {'ours x bound':>12s} "
            f"{'floor s':>7s} {'ours x floor':>12s}"
        )
        for p in pts:
            print(
                f"{p['point']:24s} {fmt_params(p['params']):>7s} {_f(_get(p, 'ours', 's_per_step'), '.2f', 11)} "
                f"{_f(_get(p, 'trl', 's_per_step'), '.2f', 10)} {_f(p.get('ratio'), '.2f', 8)} "
                f"{_f(_get(p, 'ours', 'peak_rss_gib'), '.2f', 8)} {_f(_get(p, 'trl', 'peak_rss_gib'), '.2f', 7)} "
                f"{_f(_get(p, 'ours', 'completion_tokens_per_step'), '.0f', 13)} "
                f"{_f(_get(p, 'trl', 'completion_tokens_per_step'), '.0f', 5)} "
                f"{_f(_get(p, 'ours', 'over_bound'), '.2f', 12)} {_f(_get(p, 'ours', 'floor_total_s'), '.2f', 7)} "
                f"{_f(_get(p, 'ours', 'over_floor'), '.2f', 12)}"
            )
        for note in trend_notes(pts):
            print("  " + note)
    print("\nphases, s/step (ours: generation reference training weight-sync | TRL: generation reference training)")
    for p in result["points"]:
        o, t = (_get(p, s, "phases_s", {}) for s in ("ours", "trl"))
        print(
            f"{p['point']:24s} ours {' '.join(_f(o.get(k), '.2f', 6) for k in PHASES['ours'])} | TRL "
            f"{' '.join(_f(t.get(k), '.2f', 6) for k in PHASES['trl'])}   load before {p['load_before'][0]:.2f}"
            + "".join(f"   {s} FAILED" for s in p.get("errors", {}))
        )


PHASES = {
    "ours": ("generation_s", "reference_s", "training_s", "weight_sync_s"),
    "trl": ("generation_s", "reference_s", "training_s"),
}


def trend_notes(pts: list[dict]) -> list[str]:
    """Where the ratio shrinks from one point of an axis to the next: how much each side's step and phases grew."""
    notes = []
    for a, b in zip(pts, pts[1:], strict=False):  # each point with the next: one pair fewer than points
        if not (a.get("ratio") and b.get("ratio")) or b["ratio"] >= 0.97 * a["ratio"]:
            continue
        parts = []
        for side in ("ours", "trl"):
            sa, sb = a[side], b[side]
            growth = " ".join(
                f"{k[:-2]} x{sb['phases_s'][k] / sa['phases_s'][k]:.2f}"
                for k in PHASES[side]
                if sa["phases_s"].get(k) and k in sb["phases_s"]
            )
            parts.append(f"{side} x{sb['s_per_step'] / sa['s_per_step']:.2f} ({growth})")
        notes.append(
            f"ratio shrinks {a['ratio']:.2f} -> {b['ratio']:.2f} from {a['point']} to {b['point']}: " + "; ".join(parts)
        )
    return notes


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axes_present = [a for a in AXES if axis_points(result, a)]
    fig, grid = plt.subplots(
        2,
        max(1, len(axes_present)),
        figsize=(4.6 * max(1, len(axes_present)), 6.4),
        squeeze=False,
        sharex="col",
        gridspec_kw={"height_ratios": [2, 1]},
    )
    for col, axis in enumerate(axes_present):
        pts = axis_points(result, axis)
        xs = [p[AXIS_KEY[axis]] for p in pts]
        top, bottom = grid[0][col], grid[1][col]
        for side, key, label, style in (
            ("ours", "s_per_step", "ours (fp32)", "o-"),
            ("ours", "floor_total_s", "ours' floor", "o:"),
            ("trl", "s_per_step", "TRL (fp32)", "s--"),
        ):
            got = [(x, _get(p, side, key)) for x, p in zip(xs, pts, strict=True) if _get(p, side, key)]
            if got:
                top.plot(
                    *zip(*got, strict=True), style, label=label, color="tab:blue" if side == "ours" else "tab:orange"
                )
        hi = 0.0
        for values, label, style, color in (
            (
                [(x, p["ratio"]) for x, p in zip(xs, pts, strict=True) if p.get("ratio")],
                "TRL / ours",
                "d-",
                "tab:green",
            ),
            (
                [
                    (x, _get(p, "ours", "over_floor"))
                    for x, p in zip(xs, pts, strict=True)
                    if _get(p, "ours", "over_floor")
                ],
                "ours / floor",
                "o:",
                "tab:blue",
            ),
        ):
            if values:
                bottom.plot(*zip(*values, strict=True), style, color=color, label=label)
                for x, r in values:
                    bottom.annotate(
                        f"{r:.2f}", (x, r), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=8
                    )
                hi = max([hi] + [r for _, r in values])
        bottom.set_ylim(0, hi * 1.25 if hi > 0 else 1)
        top.set_yscale("log")
        top.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        top.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        top.yaxis.set_minor_formatter(NullFormatter())
        top.set_title(AXIS_TITLE[axis])
        top.grid(True, which="both", alpha=0.3)
        bottom.grid(True, alpha=0.3)
        bottom.set_xscale("log", base=2 if axis != "model" else 10)
        bottom.set_xticks(xs)
        bottom.set_xticklabels([fmt_params(x) if axis == "model" else str(x) for x in xs])
        bottom.minorticks_off()
        if col == 0:
            top.set_ylabel("seconds per step (log)")
            bottom.set_ylabel("ratio")
            top.legend(fontsize=8)
            bottom.legend(fontsize=8, loc="lower right")
    m = result["machine"]
    against = (
        f"ours vs TRL {result.get('trl_version') or ''}, both"
        if "trl" in result.get("sides", ["trl"])
        else "ours against its floor,"
    )
    fig.suptitle(
        f"GRPO step, {against} fp32, random-weight "
        f"SmolLM2-shaped models; 135M / G=4 / 64 tokens / {result['prompts_per_step']} prompts per step "
        f"unless varied\n{result.get('cpu_flags') or m['cpu']}, {m['cores']} cores, {result['threads']} "
        f"thread(s), {result['warmup']} warm-up + {result['steps']} timed step(s) per arm",
        fontsize=9,
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--axes", default=",".join(DEFAULT_AXES), help="subset of group,length,model,prompts")
    parser.add_argument("--models", default="135m,360m,1b", help="the model-size axis: subset of 135m,360m,1b")
    parser.add_argument(
        "--large-layers",
        type=int,
        default=DEFAULT_LARGE_LAYERS,
        help="layers of the 1b model (67.1M parameters each; 10: 0.77B, see the docstring)",
    )
    parser.add_argument("--prompts-per-step", type=int, default=2, help="of every point off the prompts axis")
    parser.add_argument("--steps", type=int, default=1, help="timed optimizer steps per arm and point")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (vLLM's first step is slower)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every worker (1 on a busy machine)")
    parser.add_argument("--sides", default="ours,trl", help="ours,trl (default), or one of them")
    parser.add_argument("--trl-python", type=Path, default=TRL_PYTHON)
    parser.add_argument(
        "--ours-overrides",
        default="",
        help="Hydra overrides for our side, comma-separated (e.g. train.packed_attention=dense)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--model-root", type=Path, default=RESULTS / "scaling-models")
    parser.add_argument("--dry-run", action="store_true", help="print the points and the time estimate only")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="plumbing check: a tiny random model, one point, 0 warm-up + 1 step, 1 thread",
    )
    parser.add_argument("--plot-only", type=Path, metavar="JSON", help="redraw the figure of a results file")
    parser.add_argument("--png", type=Path, help="with --plot-only: where the figure goes (default: next to JSON)")
    parser.add_argument("--build-model", help=argparse.SUPPRESS)  # internal: the model-building subprocess
    parser.add_argument("--build-shape", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.axes = [a for a in args.axes.split(",") if a]
    args.models = [m for m in args.models.split(",") if m]
    args.sides = [s for s in args.sides.split(",") if s]
    args.ours_overrides = [o for o in args.ours_overrides.split(",") if o]
    bad = (
        [a for a in args.axes if a not in AXES]
        + [m for m in args.models if m not in ("135m", "360m", "1b")]
        + [s for s in args.sides if s not in ("ours", "trl")]
    )
    if bad or not args.sides:
        raise SystemExit(f"unknown --axes/--models/--sides entries: {bad}")
    SHAPES["1b"] = dict(SHAPES["1b"], num_hidden_layers=args.large_layers)
    if args.smoke:
        args.warmup, args.steps, args.threads, args.prompts_per_step = 0, 1, 1, 1
    return args


def main() -> None:
    args = parse_args()
    if args.build_model:
        build_model(args.build_model, args.model_root / args.build_model, json.loads(args.build_shape))
        return
    if args.plot_only:
        result = json.loads(args.plot_only.read_text())
        print_tables(result)
        png = args.png or args.plot_only.with_suffix(".png")
        plot(result, png)
        print(f"\nwrote {png}")
        return

    base = dict(BASE, prompts=args.prompts_per_step)
    base = dict(base, model="tiny", length=16) if args.smoke else base
    points = plan(args.axes, args.models, base)
    if args.smoke:
        points = [Point(base["model"], base["group"], base["length"], base["prompts"], list(args.axes))]
    names = sorted({p.model for p in points}, key=lambda n: param_count(shape_config(n)))
    cfgs = {n: shape_config(n) for n in names}
    for n in names:
        print(
            f"model {n}: {fmt_params(param_count(cfgs[n]))} parameters ({param_count(cfgs[n]):,}), "
            f"{ {k: v for k, v in cfgs[n].items() if k != 'vocab_size'} }"
        )
    rows, total = estimate(points, cfgs, args.warmup + args.steps, args.sides)
    print(
        f"\n{len(points)} points, {args.prompts_per_step} prompts/step unless varied, {args.warmup} warm-up + "
        f"{args.steps} "
        "timed step(s) per arm; estimated s/step (README's 135M step times at 2 threads, scaled by FLOPs):"
    )
    for r in rows:
        ratio = f"  TRL / ours {r['trl'] / r['ours']:.2f}" if "ours" in r and "trl" in r else ""
        print(
            f"  {r['point']:24s} "
            + "  ".join(f"{s} {r[s]:7.1f} s/step ({r[s + '_total'] / 60:5.1f} min with start-up)" for s in args.sides)
            + ratio
        )
    print(f"  estimated total: {total / 60:.0f} min", flush=True)
    if args.dry_run:
        return
    if "trl" in args.sides and not args.trl_python.exists():
        raise SystemExit(f"{args.trl_python} not found: run `bash benchmarks/versus_trl/setup_trl_env.sh` first")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from benchmarks.micro.flops import RateTries
    from benchmarks.versus_trl.trl_compare import prepare_prompts, summarize
    from grpo_rl.model.precision import cpu_flags

    t_start = time.perf_counter()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    prefix = "scaling-smoke" if args.smoke else "scaling"
    args.out.mkdir(parents=True, exist_ok=True)
    log_dir = args.out / f"{prefix}-{stamp}-logs"
    log_dir.mkdir()
    json_path, png_path = args.out / f"{prefix}-{stamp}.json", args.out / f"{prefix}-{stamp}.png"
    host = machine()
    print(f"\nCPU: {cpu_flags()}, {host['cores']} cores; {load_line()}", flush=True)

    prompts_paths = {}
    for k in sorted({p.prompts for p in points}):
        prompts_paths[k] = log_dir / f"prompts-{k}.json"
        prepare_prompts(args.warmup + args.steps, prompts_paths[k], prompts_per_step=k)
    # a non-default depth of the 1b model gets a folder of its own, so the cached default is kept
    folders = {
        n: n if n != "1b" or args.large_layers == DEFAULT_LARGE_LAYERS else f"1b-{args.large_layers}l" for n in names
    }
    models = {n: ensure_model(folders[n], cfgs[n], args.model_root, args.threads) for n in names}
    trl_version = None
    result = {
        "command": " ".join(sys.argv),
        "machine": host,
        "cpu_flags": cpu_flags(),
        "workload": WORKLOAD,
        "prompts_per_step": args.prompts_per_step,
        "steps": args.steps,
        "warmup": args.warmup,
        "threads": args.threads,
        "sides": args.sides,
        "ours_overrides": args.ours_overrides,
        "smoke": args.smoke,
        "trl_version": trl_version,
        "models": {n: {"path": str(d), "params": c["params"], "shape": cfgs[n]} for n, (d, c) in models.items()},
        "estimate": rows,
        "matmul_rates": {},
        "points": [],
    }
    # The floor's rates, per model and decoding rows: tried before every point that uses them and once more at the
    # end, each rate's best try kept (one try is a few seconds at one moment: the last point's workers still
    # exiting, or anything else on a core, lowers it), their spread reported; the floors are computed at the end.
    tries: dict[str, RateTries] = {}
    arms_of = []
    for i, p in enumerate(points):
        model_dir, cfg = models[p.model]
        rows_key = f"{p.model} x{p.prompts * p.group}"  # one decoding step's rows: prompts x G
        tries.setdefault(rows_key, RateTries(cfg, args.threads, decode_rows=p.prompts * p.group)).measure()
        rates = result["matmul_rates"][rows_key] = tries[rows_key].best()
        print(
            f"\n[{i + 1}/{len(points)}] {p.name} ({fmt_params(cfg['params'])} parameters, axes "
            f"{','.join(p.axes)}); {load_line()}; fp32 matmul {rates['fp32'] / 1e9:.0f} GFLOP/s "
            f"(this try {tries[rows_key].tries[-1]['fp32'] / 1e9:.0f})",
            flush=True,
        )
        point, arms = run_point(p, args, model_dir, cfg, rates, prompts_paths[p.prompts], log_dir)
        arms_of.append(arms)
        result["points"].append(point)
        trl_version = trl_version or (_get(point, "trl", "worker") or {}).get("trl")
        result["trl_version"] = trl_version
        if point.get("ours"):
            o = point["ours"]
            print(
                f"  -> ours {o['s_per_step']:.2f} s/step, floor {o['floor_total_s']:.2f} s ({o['over_floor']:.2f}x)"
                + (
                    f", TRL {point['trl']['s_per_step']:.2f} s/step, TRL / ours {point['ratio']:.2f}"
                    if point.get("ratio")
                    else ""
                ),
                flush=True,
            )
        json_path.write_text(json.dumps(result, indent=1))

    for t in tries.values():
        t.measure()
    for rows_key, t in tries.items():
        # The 512-row rates are the same shapes whatever the decoding rows: every try of the model counts.
        same_model = [o for k, o in tries.items() if k.split(" x")[0] == rows_key.split(" x")[0]]
        shared = RateTries.pooled(same_model, ("fp32", "bf16"))
        result["matmul_rates"][rows_key] = {
            **t.best(),
            **{k: v for k, v in shared.best().items() if k in ("fp32", "bf16")},
        }
        result.setdefault("matmul_rates_spread", {})[rows_key] = {**t.spread(), **shared.spread()}
        print(f"{rows_key}: {t.spread_line()}", flush=True)
        print(f"{rows_key}, 512 rows, every try of the model: {shared.spread_line()}", flush=True)
    for p, point, arms in zip(points, result["points"], arms_of, strict=True):  # every floor at the best tries
        model_dir, cfg = models[p.model]
        rates = result["matmul_rates"][f"{p.model} x{p.prompts * p.group}"]
        for side in args.sides:
            if point.get(side):
                point[side] = summarize(arms[side], args.warmup, rates, cfg)
    result["wall_s"] = time.perf_counter() - t_start
    result["load_end"] = os.getloadavg()
    json_path.write_text(json.dumps(result, indent=1))
    print_tables(result)
    try:
        plot(result, png_path)
        print(f"\nwrote {json_path}\nwrote {png_path}")
    except ImportError as e:
        print(f"\nwrote {json_path}; no figure ({e})")
    print(f"{result['wall_s'] / 60:.1f} min; {load_line()}")


if __name__ == "__main__":
    main()
