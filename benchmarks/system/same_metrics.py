"""A change that should not change behaviour, checked: the same runs on another commit and on this checkout must log
the same values at every step.

    python benchmarks/system/same_metrics.py --base 3688376          # sync and async, 4 steps each
    python benchmarks/system/same_metrics.py --base HEAD~3 --steps 6 sampling.max_new_tokens=96

``--base`` is checked out into a temporary git worktree. Each script (sota/grpo.py, sota/grpo-async.py) runs once
in each checkout with identical overrides: the default GSM8K config on the embedded model, 2 prompts x 4 answers,
float32 in every role (the same arithmetic on every CPU kind) and one thread (the same summation order). Every
value in ``metrics.jsonl`` is compared exactly, step by step, except timings (``*_seconds``, ``*per_second``,
``*busy_fraction``, ``*idle_fraction``). Prints the CPU line and, per script, the values compared and any that
differ; exits 1 when one does. Never asserts a time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import ROOT  # noqa: E402  (the checkout's root on sys.path first)
from benchmarks.common.runner import checkout, run_script  # noqa: E402

SCRIPTS = ("grpo.py", "grpo-async.py")
TIMING_SUFFIXES = ("_seconds", "per_second", "busy_fraction", "idle_fraction")


def overrides(steps: int, extra: list[str]) -> list[str]:
    return [
        f"train.steps={steps}",
        "env.prompts_per_step=2",
        "env.group_size=4",
        "sampling.max_new_tokens=48",
        "logger.backend=none",
        "eval.every=0",
        "train_model.precision=float32",
        "ref_model.precision=float32",
        "inference_model.precision=float32",
        *extra,
    ]


def differences(base: list[dict], head: list[dict]) -> tuple[int, list[tuple]]:
    """The count of values compared and the ``(step, key, base, head)`` of each that differs."""
    if [r["step"] for r in base] != [r["step"] for r in head]:
        return 0, [("steps", [r["step"] for r in base], [r["step"] for r in head])]
    compared, differ = 0, []
    for a, b in zip(base, head, strict=True):
        for key in sorted(set(a) | set(b)):
            if key.endswith(TIMING_SUFFIXES):
                continue
            compared += 1
            if a.get(key) != b.get(key):
                differ.append((a["step"], key, a.get(key), b.get(key)))
    return compared, differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against (any git revision)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, given to every run")
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory(prefix="same-metrics-") as tmp:
        with checkout(args.base, Path(tmp) / "base") as base_root:
            for script in SCRIPTS:
                runs = [
                    run_script(
                        script,
                        overrides(args.steps, args.overrides),
                        run_dir=Path(tmp) / f"{side}-{script}",
                        threads=1,
                        root=root,
                    )
                    for side, root in (("base", base_root), ("head", ROOT))
                ]
                compared, differ = differences(runs[0].rows, runs[1].rows)
                print(f"{script}: {len(runs[1].rows)} steps, {compared} values compared, {len(differ)} differ")
                for d in differ[:20]:
                    print("   ", d)
                failed |= bool(differ) or not compared
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
