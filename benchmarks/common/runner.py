"""``sota/grpo.py`` or ``sota/grpo-async.py`` run as a user runs it, for the benchmarks that measure whole runs.

:func:`run_script` starts the script in a subprocess with the environment every such benchmark gives it
(:func:`script_env`), waits for it, and returns the rows of the run's ``metrics.jsonl`` (one dict per logged step)
with its folder, wall time, exit status, output and peak RSS. Before the first run it prints the CPU line
(:func:`~benchmarks.common.machine.announce_machine`), so every launching benchmark names the CPU it measured on.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.common.machine import announce_machine

SHARED_DATA = ROOT.parent / "shared" / "data"  # the data folder beside a checkout, as scripts/env.sh finds it


@dataclass(frozen=True)
class ScriptRun:
    """One run of a script."""

    rows: list[dict]  # metrics.jsonl, one dict per logged step ([] when the run logged none)
    run_dir: Path  # its output_dir: metrics.jsonl, trained.jsonl, checkpoints, final_model
    seconds: float  # wall time of the process, start-up included
    returncode: int  # negative: killed by that signal (-9 at the timeout)
    output: str  # stdout and stderr interleaved; empty when they went to a log file
    peak_rss_gib: float  # ru_maxrss of the script's process and the children it reaped (not Ray's workers)


def script_env(threads: int | None = None, extra: Mapping[str, str] | None = None, root: Path = ROOT) -> dict[str, str]:
    """The environment of a benchmark's run: the caller's, with Hugging Face offline and ``GRPO_DATA_DIR`` set to
    the data folder beside the checkout unless the user set them; ``root``'s ``grpo_rl`` (this checkout's) first on
    ``PYTHONPATH``; output unbuffered (the log of a killed run ends where it was); ``OMP_NUM_THREADS`` when
    ``threads`` is given; then ``extra``."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    if "GRPO_DATA_DIR" not in env and SHARED_DATA.is_dir():
        env["GRPO_DATA_DIR"] = str(SHARED_DATA)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(extra or {})
    return env


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file (``metrics.jsonl``, ``trained.jsonl``, ``restarts.jsonl``); [] when absent."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_script(
    script: str,
    overrides: Sequence[str],
    *,
    run_dir: Path | None = None,
    log: Path | None = None,
    timeout: float | None = None,
    threads: int | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    root: Path = ROOT,
) -> ScriptRun:
    """Run ``sota/<script>`` with the Hydra ``overrides`` and ``output_dir=<run_dir>`` (a new temporary folder when
    None; an existing one, with ``resume=auto``, resumes) and return what the run left.

    Output goes to ``log`` when given (readable while the run lives), else it is returned. After ``timeout``
    seconds the script's whole process group is killed (its Ray and vLLM workers too), as it is when this process
    is interrupted. With ``check``, a run that did not exit 0 raises ``RuntimeError`` with the end of its output;
    without, the rows it logged are returned beside its ``returncode``. ``root``: the checkout whose script and
    package run (another commit's, to compare; default this one).
    """
    announce_machine()
    run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    cmd = [sys.executable, str(Path(root) / "sota" / script), *overrides, f"output_dir={run_dir}"]
    timed_out = threading.Event()
    with open(log, "w") if log else tempfile.TemporaryFile("w+", errors="replace") as out:
        t0 = time.perf_counter()
        # A process group of its own, so that a timeout or an interrupt ends its workers with it.
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=script_env(threads, env, root),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def kill_at_timeout() -> None:
            timed_out.set()
            _kill_group(proc.pid)

        timer = threading.Timer(timeout, kill_at_timeout) if timeout else None
        if timer is not None:
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # the run's own resource usage, its peak RSS included
        except BaseException:
            _kill_group(proc.pid)
            proc.wait()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: Popen must not wait for it again
        if log:
            output = ""
        else:
            out.seek(0)
            output = out.read()
    if check and proc.returncode != 0:
        killed = f", killed after {timeout:g} s" if timed_out.is_set() else ""
        tail = "\n".join((Path(log).read_text(errors="replace") if log else output).splitlines()[-40:])
        raise RuntimeError(
            f"{script} {' '.join(overrides)} failed (exit {proc.returncode}{killed}); the end of "
            f"{log or 'its output'}:\n{tail}"
        )
    return ScriptRun(
        read_jsonl(run_dir / "metrics.jsonl"), run_dir, seconds, proc.returncode, output, usage.ru_maxrss / 2**20
    )


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def checkout(rev: str, folder: Path) -> Iterator[Path]:
    """Commit ``rev`` of this repository checked out into a git worktree at ``folder`` (removed afterwards), to run
    another commit's scripts beside this checkout's (``run_script(..., root=...)``)."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), rev], check=True, capture_output=True
    )
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False)
