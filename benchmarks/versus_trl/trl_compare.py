"""Our synchronous GRPO step against Hugging Face TRL's ``GRPOTrainer`` on the same workload, in one run.

    bash benchmarks/versus_trl/setup_trl_env.sh            # once: TRL's own venv in benchmarks/.venv-trl
    .venv/bin/python benchmarks/versus_trl/trl_compare.py  # fp32 vs fp32, then our best vs TRL bf16 (~17 min)
    .venv/bin/python benchmarks/versus_trl/trl_compare.py --threads 1   # the same on a machine others are using
    .venv/bin/python benchmarks/versus_trl/trl_compare.py --round ours:fp32-unpacked,ours:fp32   # a lever, ours only
    .venv/bin/python benchmarks/versus_trl/trl_compare.py --round ours:best,ours:fp32 --steps 30 --warmup 0  # curves

Workload: SmolLM2-135M-Instruct, seed 0; 4 GSM8K train prompts per step x 4 samples, 64 new
tokens, temperature 1.0; KL coefficient 0.04 against a reference model; learning rate 1e-6; ``--warmup`` (3)
untimed steps, then ``--steps`` (5) timed optimizer steps. Both sides do the full work of every step: sample,
score with the reward, reference log-probs, policy forward and backward, optimizer step (and, on our side,
pushing the new weights into the vLLM engine). Both see the same prompts in the same order (checked every
step) and the same reward: GSM8K correctness (1.0) + the '#### N' format (0.5) + brevity (0.25), see
``benchmarks/common/workload.py``. TRL runs in its own venv (``setup_trl_env.sh``: trl 1.16.0, transformers 5.19.0,
torch 2.13.0), ``use_cpu=True``, no vLLM.

Each ``--round`` starts its arms as separate worker processes (``_ours_worker.py`` in our venv,
``_trl_worker.py`` in TRL's) and alternates them step by step, in ABBA order, so that a change in machine
load hits every arm alike; only one arm computes at any moment. Arms: ``ours:fp32`` (fp32, shared-prompt
packing), ``ours:fp32-unpacked`` (fp32, every answer with its own prompt copy: the code before packing),
``ours:best`` (packing + bf16 autocast with fp32 master weights + a bf16 vLLM engine), ``ours:fp32-compiled`` and
``ours:best-compiled`` (the same with ``train.compile=true``: decoder layers compiled before the warm-up step, which
then carries the compile time; the other arms pin ``train.compile=false``), ``trl:fp32``, ``trl:bf16`` (Trainer
``bf16=True``: autocast, fp32 master weights). ``ours:NAME@key=value@key=value`` adds Hydra overrides.

Printed and written to ``benchmarks/results/trl_compare-<time>.json``: seconds per optimizer step, completion
tokens/s, phase times, peak RSS (the worker's ``ru_maxrss``), the gradient norm of every step (non-zero: the
reward varies within groups), rewards; for our arms the floating-point work the step really needs (distinct
tokens through generation, the reference pass and the policy forward + backward), the matmul rate measured
here in fp32 and bf16, the lower bound on the step time that follows, and measured / bound; and the floor
(``flops.py``: decoding at the rate of a decoding step's 16-row matmuls, which stream every weight), with TRL's step
over our floor: the most a step built from this CPU's matmuls could gain over TRL's on this workload.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS, ROOT  # noqa: E402
from benchmarks.common.machine import machine  # noqa: E402
from benchmarks.common.workload import MARK, WORKLOAD  # noqa: E402
from benchmarks.micro.flops import RateTries, StepFlops, bounds, step_flops  # noqa: E402

HERE = Path(__file__).resolve().parent
OURS_WORKER = HERE / "_ours_worker.py"
TRL_WORKER = HERE / "_trl_worker.py"
TRL_PYTHON = ROOT / "benchmarks" / ".venv-trl" / "bin" / "python"  # setup_trl_env.sh makes it

# Each preset states every precision setting, so a change of the YAML defaults does not move an arm.
FP32 = ["train_model.precision=float32", "ref_model.precision=float32", "inference_model.precision=float32"]
BF16 = ["train_model.precision=bfloat16", "ref_model.precision=bfloat16", "inference_model.precision=bfloat16"]
# train.compile is pinned too: ``auto`` would compile in the middle of the timed steps (the workers' runs are
# nominally 1000 steps long); the -compiled presets compile before the warm-up step, which absorbs the cost.
EAGER, COMPILED = ["train.compile=false"], ["train.compile=true"]
PRESETS = {
    "fp32": ["train.share_prompt=true", *FP32, *EAGER],
    "fp32-compiled": ["train.share_prompt=true", *FP32, *COMPILED],
    "fp32-unpacked": ["train.share_prompt=false", *FP32, *EAGER],
    "best": ["train.share_prompt=true", *BF16, *EAGER],
    "best-compiled": ["train.share_prompt=true", *BF16, *COMPILED],
    # config/preset/lowmem.yaml at the precision auto picks on a bf16-capable CPU: generation with the learner's
    # own model, 8-bit AdamW moments, a bf16 reference, one group per micro-batch
    "lowmem": ["+preset=lowmem", *BF16, *EAGER],
}
# The workload keeps at most 4 x (prompt + 4 x 64) ~ 2.4k tokens in the engine: 110 MB of fp32 KV cache.
COMMON_OURS = ["inference_model.kv_cache_gb=0.25"]
DEFAULT_ROUNDS = ["ours:fp32,trl:fp32", "ours:best,trl:bf16"]


@dataclass
class Arm:
    side: str  # "ours" | "trl"
    label: str
    overrides: list[str] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    ready: dict = field(default_factory=dict)
    done: dict = field(default_factory=dict)
    log_path: Path | None = None

    @property
    def name(self) -> str:
        return f"{self.side}:{self.label}"

    @property
    def bf16(self) -> bool:
        if self.side == "trl":
            return self.label == "bf16"
        return "train_model.precision=bfloat16" in self.overrides

    @property
    def engine_dtype(self) -> str:
        for o in self.overrides:
            if o.startswith("inference_model.precision="):
                return o.split("=", 1)[1]
        return "float32"


def parse_arm(spec: str) -> Arm:
    side, _, rest = spec.partition(":")
    label, *extra = rest.split("@")
    if side == "trl":
        if label not in ("fp32", "bf16") or extra:
            raise SystemExit(f"--round: TRL arms are trl:fp32 and trl:bf16, not {spec!r}")
        return Arm("trl", label)
    if side != "ours":
        raise SystemExit(f"--round: an arm is ours:LABEL or trl:fp32|bf16, not {spec!r}")
    if label not in PRESETS and not extra:
        raise SystemExit(f"--round: unknown preset {label!r}; use {', '.join(PRESETS)} or ours:NAME@key=value")
    merged = dict(o.split("=", 1) for o in COMMON_OURS + PRESETS.get(label, PRESETS["fp32"]) + extra)  # later wins
    return Arm("ours", rest, [f"{k}={v}" for k, v in merged.items()])


def prepare_prompts(total_steps: int, path: Path, prompts_per_step: int | None = None) -> list[dict]:
    """The prompts of every step, in order, as our environment draws them (seed 0); TRL gets the same list.

    ``prompts_per_step``: the workload's unless given (``scaling.py`` runs other sizes).
    """
    from benchmarks.versus_trl._ours_worker import compose, workload_overrides
    from grpo_rl.envs import make_env
    from grpo_rl.envs.data import load_records
    from grpo_rl.envs.tasks.gsm8k.env import gsm8k_messages
    from grpo_rl.model.loading import load_tokenizer, resolve_model

    extra = [] if prompts_per_step is None else [f"env.prompts_per_step={prompts_per_step}"]
    cfg = compose(workload_overrides(tempfile.mkdtemp(prefix="trl_compare_")) + extra)
    tokenizer = load_tokenizer(resolve_model(WORKLOAD["model"]))
    env = make_env(cfg, tokenizer)
    records = load_records("gsm8k", split="train", path=cfg.env.path)
    rows = []
    for _ in range(total_steps):
        td = env.reset()
        for idx, ref in zip(td["prompt_index"].tolist(), list(td["reference"]), strict=True):
            rows.append(
                {
                    "prompt_index": idx,
                    "reference": ref,
                    "messages": gsm8k_messages(records[idx], template=cfg.env.template),
                }
            )
    path.write_text(json.dumps(rows))
    return rows


class Worker:
    """A worker process and its line protocol."""

    def __init__(self, arm: Arm, cmd: list[str], env: dict, log_path: Path):
        self.arm = arm
        self.log = open(log_path, "w")
        arm.log_path = log_path
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1
        )

    def read_event(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.log.flush()
                tail = Path(self.arm.log_path).read_text()[-3000:]
                raise RuntimeError(f"{self.arm.name} worker exited (rc={self.proc.wait()}); log tail:\n{tail}")
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
            self.log.write(line)

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.send("quit")
            self.arm.done = self.read_event()
        finally:
            self.proc.wait(timeout=120)
            self.log.close()


def start_worker(
    arm: Arm,
    args,
    prompts_path: Path,
    model_path: str,
    total_steps: int,
    log_dir: Path,
    trl_args: list[str] | tuple = (),
) -> Worker:
    """``trl_args``: extra options of a TRL worker (``--group-size`` ...; ``scaling.py``), none by default."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(args.threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        VLLM_LOGGING_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    if arm.side == "ours":
        cmd = [
            sys.executable,
            str(OURS_WORKER),
            "--prompts",
            str(prompts_path),
            "--threads",
            str(args.threads),
            *arm.overrides,
        ]
    else:
        cmd = [
            str(args.trl_python),
            str(TRL_WORKER),
            "--prompts",
            str(prompts_path),
            "--model",
            model_path,
            "--threads",
            str(args.threads),
            "--steps",
            str(total_steps),
            *trl_args,
        ]
        if arm.bf16:
            cmd.append("--bf16")
    return Worker(arm, cmd, env, log_dir / f"{arm.name.replace(':', '_')}.log")


def run_round(
    arms: list[Arm], args, prompts_path: Path, model_path: str, log_dir: Path, trl_args: list[str] | tuple = ()
) -> dict:
    total = args.warmup + args.steps
    load_before = os.getloadavg()
    workers = []
    try:
        for arm in arms:  # start one at a time: start-up is CPU-heavy too
            w = start_worker(arm, args, prompts_path, model_path, total, log_dir, trl_args)
            workers.append(w)
            arm.ready = w.read_event()
            print(f"  {arm.name} ready in {arm.ready['startup_s']:.1f} s", flush=True)
        for step in range(total):
            order = workers if step % 2 == 0 else workers[::-1]  # ABBA
            for w in order:
                w.send("step")
                ev = w.read_event()
                w.arm.steps.append(ev)
                print(
                    f"  step {step} {w.arm.name:22s} {ev['seconds']:7.2f} s  grad_norm {ev['grad_norm']:.4f}  "
                    f"reward {ev['reward_mean']:.3f}  load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    finally:
        for w in workers:
            try:
                w.close()
            except Exception as e:  # report, keep closing the others
                print(f"  closing {w.arm.name}: {e}", flush=True)
                w.proc.kill()
    return {"arms": [a.name for a in arms], "load_before": load_before, "load_after": os.getloadavg()}


def summarize(arm: Arm, warmup: int, rates: dict, model_cfg: dict) -> dict:
    timed = arm.steps[warmup:] or arm.steps
    secs = [s["seconds"] for s in timed]
    tokens = sum(s["completion_tokens"] for s in timed)
    phases = [
        k
        for k in ("generation_s", "reference_s", "training_s", "weight_sync_s", "reward_s", "policy_logprob_s")
        if k in timed[0]
    ]
    out = {
        "arm": arm.name,
        "overrides": arm.overrides,
        "timed_steps": len(timed),
        "s_per_step": statistics.mean(secs),
        "s_per_step_median": statistics.median(secs),
        "s_per_step_min": min(secs),
        "completion_tokens_per_s": tokens / sum(secs),
        "completion_tokens_per_step": tokens / len(timed),
        "phases_s": {k: statistics.mean(s[k] for s in timed) for k in phases},
        "per_step_s": [{k: s[k] for k in ("seconds", *phases)} for s in arm.steps],  # warm-up steps included
        "peak_rss_gib": max([s["peak_rss_gib"] for s in arm.steps] + [arm.done.get("peak_rss_gib", 0.0)]),
        "grad_norms": [s["grad_norm"] for s in arm.steps],
        "rewards": [s["reward_mean"] for s in arm.steps],
        "reward_std_within_groups": [s["reward_std_within_groups"] for s in arm.steps],
        "prompts_match": all(s["prompts_match"] for s in arm.steps),
        "startup_s": arm.ready.get("startup_s"),
        "worker": arm.ready.get("config"),
        "log": str(arm.log_path),
    }
    out["weight_sync_fraction"] = out["phases_s"].get("weight_sync_s", 0.0) / out["s_per_step"]
    first = arm.steps[0]
    for key in ("packed_vs_unpacked_max_abs", "engine_vs_ref_mean_abs"):
        if key in first:
            out[key] = first[key]
    if arm.side == "ours":
        per_step = [step_flops(model_cfg, s["groups"]) for s in timed]
        total = StepFlops.mean(per_step)
        both = bounds(
            total,
            rates,
            engine="bf16" if arm.engine_dtype == "bfloat16" else "fp32",
            train="bf16" if arm.bf16 else "fp32",
        )
        out["flops"] = {
            "generation": total.generation,
            "decode": total.decode,
            "reference": total.reference,
            "training": total.training,
            "tokens": total.tokens,
            "sequences": total.sequences,
        }
        out["bound_s"], out["floor_s"] = both["bound"], both["floor"]
        out["bound_total_s"] = sum(both["bound"].values())
        out["over_bound"] = out["s_per_step"] / out["bound_total_s"]
        out["floor_total_s"] = sum(both["floor"].values())
        out["over_floor"] = out["s_per_step"] / out["floor_total_s"]
    return out


def print_table(summaries: list[dict], rates: dict) -> None:
    print("\n" + "=" * 134)
    hdr = (
        f"{'arm':24s} {'s/step':>7s} {'(min)':>6s} {'tok/s':>6s} {'gen':>6s} {'ref':>6s} {'train':>6s} {'sync':>5s} "
        f"{'RSS GiB':>7s} {'bound':>6s} {'x bound':>7s} {'floor':>6s} {'x floor':>7s}  grad norms"
    )
    print(hdr)
    for s in summaries:
        ph = s["phases_s"]
        bound = (
            f"{s['bound_total_s']:6.2f} {s['over_bound']:7.2f} {s['floor_total_s']:6.2f} {s['over_floor']:7.2f}"
            if "bound_total_s" in s
            else f"{'-':>6s} {'-':>7s} {'-':>6s} {'-':>7s}"
        )
        print(
            f"{s['arm']:24s} {s['s_per_step']:7.2f} {s['s_per_step_min']:6.2f} {s['completion_tokens_per_s']:6.1f} "
            f"{ph.get('generation_s', 0):6.2f} {ph.get('reference_s', 0):6.2f} {ph.get('training_s', 0):6.2f} "
            f"{ph.get('weight_sync_s', 0):5.2f} {s['peak_rss_gib']:7.2f} {bound}  "
            + " ".join(f"{g:.3g}" for g in s["grad_norms"])
        )
    print(
        f"\nbest matmul rate measured here ({rates['threads']} threads, model shapes, threads sleeping or spinning): "
        f"fp32 {rates['fp32'] / 1e9:.0f} "
        f"GFLOP/s, bf16 {rates['bf16'] / 1e9:.0f} GFLOP/s at 512 rows; a decoding step at {rates['decode_rows']} "
        f"rows: fp32 {rates['fp32_decode'] / 1e9:.0f} GFLOP/s, bf16 {rates['bf16_decode'] / 1e9:.0f} GFLOP/s"
    )
    for s in summaries:
        if "flops" in s:
            f, b = s["flops"], s["bound_s"]
            print(
                f"{s['arm']:24s} needs {f['generation'] / 1e9:6.0f} GFLOP generation, {f['reference'] / 1e9:5.0f} "
                f"reference, {f['training'] / 1e9:6.0f} policy fwd+bwd ({f['tokens']:.0f} distinct tokens per pass) "
                f"-> bound {b['generation_s']:.2f} + {b['reference_s']:.2f} + {b['training_s']:.2f} s; floor "
                f"{s['floor_s']['generation_s']:.2f} + {b['reference_s']:.2f} + {b['training_s']:.2f} s "
                f"({f['decode'] / 1e9:.0f} GFLOP of the generation decoding {f['sequences']:.0f} answers together)"
            )
        if "packed_vs_unpacked_max_abs" in s:
            print(
                f"{s['arm']:24s} warm-up batch: packed vs unpacked ref log-probs max |diff| "
                f"{s['packed_vs_unpacked_max_abs']:.2e}; engine vs ref mean |diff| {s['engine_vs_ref_mean_abs']:.2e}"
            )
        if not s["prompts_match"]:
            print(f"WARNING {s['arm']}: saw different prompts than planned")


def comparisons(summaries: list[dict]) -> dict:
    by = {s["arm"]: s for s in summaries}
    ours = [s for s in summaries if s["arm"].startswith("ours:")]
    trl = [s for s in summaries if s["arm"].startswith("trl:")]
    out = {}
    if "trl:fp32" in by:  # every fp32 arm of ours against TRL's fp32 step
        fp32 = {
            s["arm"]: by["trl:fp32"]["s_per_step"] / s["s_per_step"]
            for s in ours
            if "train_model.precision=float32" in s["overrides"]
        }
        if "ours:fp32" in fp32:
            out["equal_precision_fp32_speedup"] = fp32["ours:fp32"]
        if fp32:
            out["equal_precision_fp32_speedup_by_arm"] = fp32
    if ours and trl:
        best_ours = min(ours, key=lambda s: s["s_per_step"])
        best_trl = min(trl, key=lambda s: s["s_per_step"])
        out["best_vs_best"] = {
            "ours": best_ours["arm"],
            "trl": best_trl["arm"],
            "speedup": best_trl["s_per_step"] / best_ours["s_per_step"],
        }
        # TRL's step over our floor: the most any step built from these matmuls could gain on this workload.
        out["trl_over_our_floor"] = {
            f"{t['arm']} / {o['arm']}": t["s_per_step"] / o["floor_total_s"]
            for o in ours
            if "floor_total_s" in o
            for t in trl
            if (t["arm"] == "trl:fp32") == ("train_model.precision=float32" in o["overrides"])
        }
        out["memory_ratio_ours_over_trl"] = max(s["peak_rss_gib"] for s in ours) / min(s["peak_rss_gib"] for s in trl)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--round",
        action="append",
        dest="rounds",
        help="comma-separated arms alternated step by step (repeatable); default: " + " then ".join(DEFAULT_ROUNDS),
    )
    parser.add_argument("--steps", type=int, default=5, help="timed optimizer steps per arm")
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed steps first: a process runs its first train_step calls slower (system/train_phase.py)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch threads of every worker; use 1 on a shared machine: with 2, another busy process "
        "makes OpenMP barriers collapse and steps run 5-10x slower",
    )
    parser.add_argument("--trl-python", type=Path, default=TRL_PYTHON)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rounds = [[parse_arm(a) for a in r.split(",")] for r in (args.rounds or DEFAULT_ROUNDS)]
    if any(a.side == "trl" for r in rounds for a in r) and not args.trl_python.exists():
        raise SystemExit(f"{args.trl_python} not found: run `bash benchmarks/versus_trl/setup_trl_env.sh` first")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from grpo_rl.model.loading import resolve_model

    model_path = resolve_model(WORKLOAD["model"])
    model_cfg = json.loads((Path(model_path) / "config.json").read_text())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    log_dir = args.out / f"trl_compare-{stamp}-logs"
    log_dir.mkdir()
    prompts_path = log_dir / "prompts.json"
    prepare_prompts(args.warmup + args.steps, prompts_path)

    host = machine()
    print(
        f"{host['cpu']}, {host['cores']} cores, {' '.join(host['isa'])}; load average {os.getloadavg()}; "
        "measuring the matmul rate ...",
        flush=True,
    )
    decode_rows = WORKLOAD["prompts_per_step"] * WORKLOAD["group_size"]
    # The floor's rates: tried before the rounds and after each, each rate's best try kept (one try is a few seconds
    # at one moment; a worker still exiting lowers it), with their spread reported.
    tries = RateTries(model_cfg, args.threads, decode_rows=decode_rows)
    tries.measure()
    round_info = []
    for arms in rounds:
        print(f"round: {', '.join(a.name for a in arms)}", flush=True)
        round_info.append(run_round(arms, args, prompts_path, model_path, log_dir))
        tries.measure()
    rates = tries.best()

    summaries = [summarize(a, args.warmup, rates, model_cfg) for arms in rounds for a in arms]
    print_table(summaries, rates)
    print(tries.spread_line())
    comp = comparisons(summaries)
    for k, v in comp.items():
        print(f"{k}: {v}")
    for info in round_info:
        print(
            f"round {info['arms']}: load average before {info['load_before'][0]:.2f}, after {info['load_after'][0]:.2f}"
        )
    result = {
        "workload": WORKLOAD,
        "steps": args.steps,
        "warmup": args.warmup,
        "threads": args.threads,
        "machine": host,
        "command": " ".join(sys.argv),
        "rates_flops_per_s": rates,
        "rates_spread": tries.spread(),
        "rounds": round_info,
        "arms": summaries,
        "comparisons": comp,
    }
    path = args.out / f"trl_compare-{stamp}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
