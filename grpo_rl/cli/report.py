"""One offline page for a run, or for the runs of a sweep: curves, timeline, answers token by token, events.

    python -m grpo_rl.cli.report outputs/2026-01-01/12-00-00          # writes <run>/report.html
    python -m grpo_rl.cli.report multirun/2026-01-01/12-00-00         # the sweep's runs overlaid, <sweep>/report.html
    python -m grpo_rl.cli.report runs/a runs/b --out compare.html --open

Each argument is a run folder or a sweep folder (its jobs), as for :mod:`grpo_rl.cli.plot`; runs of one sweep
are labelled by the overrides that differ between them. The page (:mod:`grpo_rl.run.report`) needs no network
and no server: open it from the file system. A run writes its own at the end (``report.enabled``) and every
``report.every`` steps.
"""

from __future__ import annotations

import argparse
import webbrowser
from pathlib import Path

from grpo_rl.cli.sweep_summary import find_runs, metrics_dir, run_label, summarize_run, varying_keys
from grpo_rl.run.report import MAX_TOKEN_STEPS, write_report


def report_runs(paths: list[str | Path]) -> list[tuple[str, Path]]:
    """``(label, folder with the run's logs)`` of every run among ``paths`` (run or sweep folders)."""
    run_dirs = find_runs(paths)
    summaries = [summarize_run(d) for d in run_dirs]
    keys = varying_keys(summaries)
    return [(run_label(s, keys), metrics_dir(d)) for d, s in zip(run_dirs, summaries, strict=True)]


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m grpo_rl.cli.report", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", help="run folders or sweep folders")
    parser.add_argument("--out", default=None, help="HTML to write (default: report.html in the first folder given)")
    parser.add_argument("--title", default=None)
    parser.add_argument(
        "--max-token-steps",
        type=int,
        default=MAX_TOKEN_STEPS,
        help=f"steps whose answers keep their token data, spread over the run (default: {MAX_TOKEN_STEPS})",
    )
    parser.add_argument("--open", action="store_true", help="open the page in the default browser")
    args = parser.parse_args(argv)
    for path in map(Path, args.paths):
        if not path.is_dir():
            parser.error(f"{path} is not a folder: give a run folder (with metrics.jsonl) or a sweep's folder")
    try:
        runs = report_runs(args.paths)
    except FileNotFoundError as e:  # a folder with no run in it: find_runs says which
        parser.error(str(e))
    out = Path(args.out) if args.out else Path(args.paths[0]) / "report.html"
    out = write_report(runs, out, title=args.title, max_token_steps=args.max_token_steps)
    print(out)
    if args.open:
        webbrowser.open(out.resolve().as_uri())
    return out


if __name__ == "__main__":
    main()
