"""The asynchronous pipeline at scale, by simulation: the real orchestration with timed stand-in roles.

    python benchmarks/system/pipeline_scale.py                      # 1-16 collectors x 1-4 learner ranks (~30 min)
    python benchmarks/system/pipeline_scale.py --quick              # the two smallest sizes, under 5 minutes
    python benchmarks/system/pipeline_scale.py --generation 8 --reference 1 --training 4 --jitter 0.1 --steps 6

Each size runs ``sota/grpo-async.py`` with ``simulate.enabled=true`` (grpo_rl/training/simulated.py): collector actors
with their environments, rewards and buffer, the staleness gate, the reference as a stage of its own (one actor),
learner ranks with their gloo collective, weight pushes of a tiny model's real tensors, checkpoints, all real;
only generation, reference scoring and training sleep for the seconds set here (per batch, with jitter). A size
runs ``--steps`` steps, stops, and resumes with ``resume=auto`` for as many more, so every size also goes
through a resume, and its trained.jsonl must show no group trained twice.

Per size it prints:

* throughput: batches per second over the measured steps, from the wall time between consecutive steps (the first
  ``--skip`` steps after each start are not measured: actors start, and what the pipeline made while the learner
  waited for its first batch is trained faster than the steady state makes it; ``collectors + buffer`` skips it all);
* ideal ``1 / max(stage)`` and the synchronous figure ``1 / sum(stages)``, with the stage times
  generation / collectors, reference, training / ranks;
* efficiency: throughput / ideal;
* staleness mean and max against ``pipeline.max_staleness``, and dropped samples;
* orchestration overhead per step: the learner's wall time per step minus its wait for a batch and minus the
  seconds its stand-in slept (the slowest rank's), and where it went: the call to the ranks, the push, the rest
  of the step (the source's call to the buffer, the gate, the advantages), the logs and checkpoint between steps.

``--long-tail S`` spreads the answer lengths (``simulate.long_tail``: a group takes as long as its longest answer),
``--inflight`` pushes weights under answers in flight (``pipeline.inflight_updates``; then the mean age of the
trained tokens, ``token_staleness_mean``, each token's own version, is reported beside the groups' age) and
``--whole-batches`` collects ``P`` groups at a time, handed over when the last is done (``pipeline.whole_batches``,
the pipeline before groups streamed). The simulated engine runs ``P x G`` answers at once, each for its own length
(``simulate.max_num_seqs``); ``--groups-in-flight N`` keeps ``N`` groups on it, those beyond its places waiting to
start as answers end (``pipeline.groups_in_flight``; default ``P``: the engine's places empty as a group's short
answers end, until its longest does). ``--arms`` runs several of these settings per size, ``--repeat`` times each, in
turn (so a drift of the machine falls on every arm), and ends with a table of trained samples per second::

    python benchmarks/system/pipeline_scale.py --sizes 2x1,4x1 --long-tail 2 --answer-tokens 256 --inflight
    python benchmarks/system/pipeline_scale.py --sizes 2x1,4x1 --long-tail 2 --answer-tokens 256 --prompts 4 \
        --generation 24 --training 2 --reference 0 --steps 4 --repeat 2 \
        --arms whole,stream,whole+inflight,stream+inflight

Ends with ``min efficiency: X``. Writes JSON. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine, cpu_line  # noqa: E402
from benchmarks.common.runner import read_jsonl, run_script  # noqa: E402

SIZES = [(c, r) for r in (1, 2, 4) for c in (1, 2, 4, 8, 16)]


def measure(args, model: Path, collectors: int, ranks: int, out: Path) -> dict:
    run_dir = out / f"c{collectors}_r{ranks}"
    common = [
        f"model.name={model}",
        "logger.backend=none",
        "logger.num_examine=0",
        "eval.every=0",
        "simulate.enabled=true",
        f"simulate.generation_seconds={args.generation}",
        f"simulate.reference_seconds={args.reference}",
        f"simulate.training_seconds={args.training}",
        f"simulate.jitter={args.jitter}",
        f"inference_model.num_devices={collectors}",
        f"train_model.num_devices={ranks}",
        f"env.prompts_per_step={args.prompts}",
        f"env.group_size={args.group}",
        f"pipeline.max_staleness={args.max_staleness}",
        f"pipeline.buffer_capacity={args.buffer}",
        "train_model.precision=float32",
        "ref_model.precision=float32",
        "inference_model.precision=float32",
        f"simulate.long_tail={args.long_tail}",
        f"simulate.answer_tokens={args.answer_tokens}",
        f"sampling.max_new_tokens={max(args.answer_tokens, 16)}",
        f"pipeline.inflight_updates={args.inflight}",
        f"pipeline.whole_batches={args.whole_batches}",
        f"pipeline.groups_in_flight={args.groups_in_flight or 'null'}",
    ]
    if args.reference > 0:
        common += ["policy.kl_coef=0.01", "ref_model.placement=actor"]
    else:
        common += ["policy.kl_coef=0"]
    t0 = time.perf_counter()
    run_script("grpo-async.py", common + [f"train.steps={args.steps}"], run_dir=run_dir, timeout=args.timeout)
    rows = run_script(
        "grpo-async.py",
        common + [f"train.steps={2 * args.steps}", "resume=auto"],
        run_dir=run_dir,
        timeout=args.timeout,
    ).rows
    wall = time.perf_counter() - t0
    records = read_jsonl(run_dir / "trained.jsonl")
    trained = [g for r in records for g in r["group_index"]]
    # Wall time per step: between the ends of consecutive steps of one process (trained.jsonl's times). The first
    # `skip` steps after each start are not measured: actors start, and the pipeline fills; what it made while the
    # learner waited for its first batch (up to a batch in flight per collector, and the buffer) is trained at the
    # learner's pace, faster than the steady state can make it.
    ends = {r["step"]: r["time"] for r in records}
    skip = max(1, args.skip)
    wall_per_step = {s: ends[s] - ends[s - 1] for s in ends if s - 1 in ends and (s - 1) % args.steps >= skip}
    measured = [r for r in rows if r["step"] in wall_per_step]

    stage_gen = args.generation / collectors
    stage_ref = args.reference  # one reference actor
    stage_train = args.training / ranks
    stages = [stage_gen, stage_ref, stage_train]
    seconds = sum(wall_per_step.values())
    throughput = len(measured) / seconds
    ideal, sync = 1 / max(stages), 1 / sum(stages)
    # what the learner spent on anything but waiting for a batch and its (simulated) training
    overhead = [
        wall_per_step[r["step"]] - r["learner_wait_seconds"] - r["simulated_training_seconds"] for r in measured
    ]
    # ... and where it went, from what every step logs: the fan-out of a training step to the ranks, the push, the
    # rest of the step (the source's calls, the gate, the advantages), and the bookkeeping between two steps (the
    # logs, the checkpoint)
    parts = {
        "training_call": [r["training_seconds"] - r["simulated_training_seconds"] for r in measured],
        "push": [r["weight_sync_seconds"] for r in measured],
        "source_and_rest": [
            r["step_seconds"] - r["learner_wait_seconds"] - r["training_seconds"] - r["weight_sync_seconds"]
            for r in measured
        ],
        "between_steps": [wall_per_step[r["step"]] - r["step_seconds"] for r in measured],
    }
    return {
        "collectors": collectors,
        "ranks": ranks,
        "steps": len(rows),
        "measured_steps": len(measured),
        "throughput": throughput,
        "samples_per_second": throughput * args.prompts * args.group,
        "ideal": ideal,
        "sync": sync,
        "efficiency": throughput / ideal,
        "staleness_mean": statistics.mean(r["staleness_mean"] for r in measured),
        "staleness_max": max(r["staleness_max"] for r in rows),
        "bound": args.max_staleness,
        "token_staleness_mean": statistics.mean(r.get("token_staleness_mean", r["staleness_mean"]) for r in measured),
        "dropped_samples": sum(r["dropped_samples"] for r in rows),
        "overhead_seconds": statistics.mean(overhead),
        "overhead_max_seconds": max(overhead),
        "overhead_parts": {k: statistics.mean(v) for k, v in parts.items()},
        "learner_wait_seconds": statistics.mean(r["learner_wait_seconds"] for r in measured),
        "groups_trained": len(trained),
        "groups_trained_twice": len(trained) - len(set(trained)),
        "wall_seconds": wall,
        "stages": stages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the two smallest sizes")
    parser.add_argument("--generation", type=float, default=8.0, help="seconds one collector takes per batch")
    parser.add_argument("--reference", type=float, default=1.0, help="reference seconds per batch (0: no KL)")
    parser.add_argument("--training", type=float, default=4.0, help="training seconds per batch on one rank")
    parser.add_argument("--jitter", type=float, default=0.1)
    parser.add_argument(
        "--steps", type=int, default=None, help="steps before the resume, and after it (default 6; 4 with --quick)"
    )
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument(
        "--skip",
        type=int,
        default=1,
        help="steps after each start not measured (the pipeline filling); collectors + buffer skips all it can "
        "have made before the first step",
    )
    parser.add_argument("--max-staleness", type=int, default=4)
    parser.add_argument("--buffer", type=int, default=2)
    parser.add_argument("--long-tail", type=float, default=0.0, help="simulate.long_tail: answer-length spread")
    parser.add_argument("--answer-tokens", type=int, default=16, help="tokens of the longest answer")
    parser.add_argument("--inflight", action="store_true", help="pipeline.inflight_updates=true")
    parser.add_argument("--whole-batches", action="store_true", help="pipeline.whole_batches=true")
    parser.add_argument(
        "--groups-in-flight",
        type=int,
        default=None,
        help="pipeline.groups_in_flight (default: --prompts); the engine runs prompts x group answers at once",
    )
    parser.add_argument(
        "--arms",
        help="settings to compare per size, e.g. whole,stream,whole+inflight,stream+inflight,stream+inflight+g8 "
        "(+gN: N groups in flight a collector; overrides the three flags)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each arm per size (with --arms)")
    parser.add_argument("--sizes", help="collectors x ranks, e.g. 1x1,4x2 (default: all, or the quick ones)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", default=str(RESULTS / "pipeline_scale.json"))
    parser.add_argument("--keep", help="keep the run folders (metrics.jsonl, trained.jsonl, logs) under this folder")
    args = parser.parse_args()
    sizes = [(1, 1), (2, 1)] if args.quick else SIZES
    if args.steps is None:
        args.steps = 4 if args.quick else 6
    if args.skip >= args.steps - 1:
        parser.error(f"--skip {args.skip} leaves fewer than two steps of --steps {args.steps} to measure")
    if args.sizes:
        sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]

    from grpo_rl.model.loading import build_tiny_model, resolve_model

    announce_machine()
    print(
        f"stage seconds per batch: generation {args.generation} (per collector), reference {args.reference}, "
        f"training {args.training} (one rank), jitter {args.jitter}; {args.steps} + {args.steps} steps "
        f"(resumed; the first {max(1, args.skip)} after each start not measured), "
        f"max_staleness {args.max_staleness}, buffer {args.buffer}; long tail {args.long_tail}, "
        f"in-flight updates {args.inflight}",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="pipeline-scale-") as tmp:
        if args.keep:
            tmp = args.keep
            Path(tmp).mkdir(parents=True, exist_ok=True)
        model = build_tiny_model(resolve_model("embedded:smollm2-135m-instruct"), Path(tmp) / "model")
        header = (
            f"{'collectors':>10} {'ranks':>5} {'batch/s':>8} {'ideal':>7} {'sync':>7} {'effic.':>6} "
            f"{'stale mean/max':>14} {'token age':>9} {'dropped':>7} {'overhead s':>10} {'twice':>5} {'wall s':>6}"
        )
        print(header, flush=True)
        arms = args.arms.split(",") if args.arms else [None]
        runs = [(size, arm, i) for size in sizes for i in range(args.repeat if args.arms else 1) for arm in arms]
        for (collectors, ranks), arm, i in runs:
            if arm is not None:
                kind, *options = arm.split("+")
                args.whole_batches, args.inflight = kind == "whole", "inflight" in options
                args.groups_in_flight = next((int(o[1:]) for o in options if o.startswith("g")), None)
            r = measure(args, model, collectors, ranks, Path(tmp) / f"{arm or 'run'}{i}")
            r.update(
                arm=arm,
                repeat=i,
                whole_batches=args.whole_batches,
                inflight=args.inflight,
                groups_in_flight=args.groups_in_flight,
            )
            results.append(r)
            if arm is not None:
                print(f"{'':>10} arm {arm}, run {i + 1} of {args.repeat}", flush=True)
            print(
                f"{collectors:>10} {ranks:>5} {r['throughput']:>8.3f} {r['ideal']:>7.3f} {r['sync']:>7.3f} "
                f"{r['efficiency']:>6.2f} {r['staleness_mean']:>8.2f}/{r['staleness_max']}<={r['bound']} "
                f"{r['token_staleness_mean']:>9.2f} "
                f"{r['dropped_samples']:>7} {r['overhead_seconds']:>10.3f} {r['groups_trained_twice']:>5} "
                f"{r['wall_seconds']:>6.0f}",
                flush=True,
            )
    print(
        "overhead per step, where it went (s): training call to the ranks / push / source and the rest of the "
        "step / between steps (logs, checkpoint)"
    )
    for r in results:
        print(f"{r['collectors']:>10} {r['ranks']:>5}  " + " / ".join(f"{v:.3f}" for v in r["overhead_parts"].values()))
    if args.arms:
        print("trained samples per second (each run), and dropped samples, by arm:")
        for collectors, ranks in sizes:
            for arm in arms:
                mine = [r for r in results if (r["collectors"], r["ranks"], r["arm"]) == (collectors, ranks, arm)]
                rates = " ".join(f"{r['samples_per_second']:.2f}" for r in mine)
                mean = statistics.mean(r["samples_per_second"] for r in mine)
                dropped = sum(r["dropped_samples"] for r in mine)
                base = [r for r in results if (r["collectors"], r["ranks"], r["arm"]) == (collectors, ranks, arms[0])]
                ratio = mean / statistics.mean(r["samples_per_second"] for r in base)
                print(
                    f"  {collectors}x{ranks} {arm:>16}: {rates}  (mean {mean:.2f}, {ratio:.2f}x {arms[0]}; "
                    f"dropped {dropped})"
                )
    print(cpu_line(), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"args": vars(args), "cpu": cpu_line(), "results": results}, indent=2))
    print(f"min efficiency: {min(r['efficiency'] for r in results):.3f}")


if __name__ == "__main__":
    main()
