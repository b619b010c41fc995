"""Both scripts with ``inference_model.engine=vllm_server``: the run starts a vLLM server, samples what the
in-process engine samples for the same seed, and leaves no server behind, whether the driver is stopped by
SIGTERM or killed by SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT, run_script, script_env, tiny_overrides, trained_groups

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SERVED = ["inference_model.engine=vllm_server"]
RUN_KEY = "a-key-of-thirty-two-characters-at-least"


def first_answers(run_dir: Path) -> list[str]:
    """The answers logged for step 1 (the first answer of each examined group), in stream order: the
    asynchronous run's batch holds its groups as they finished."""
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines() if line.strip()]
    return [r["response"] for r in sorted((r for r in rows if r["step"] == 1), key=lambda r: r["group_index"])]


def server_sessions(log: str) -> list[int]:
    """The process ids of the run's servers (each leads a session of its own), from the start-up log."""
    return [int(pid) for pid in re.findall(r"engine server unix:\S+ is up \(pid (\d+)", log)]


def alive_in_session(sid: int) -> list[str]:
    """Processes of session ``sid`` still running (the server and its engine process)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":  # session id; zombies hold no resources
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError, PermissionError):
            continue
    return found


def wait_gone(sids: list[int], seconds: float = 60) -> list[str]:
    deadline = time.monotonic() + seconds
    left = [p for sid in sids for p in alive_in_session(sid)]
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = [p for sid in sids for p in alive_in_session(sid)]
    return left


@pytest.fixture(scope="module")
def in_process_answers(tiny_model_dir, tmp_path_factory) -> list[str]:
    run_dir = tmp_path_factory.mktemp("in_process")
    proc = run_script("grpo.py", *tiny_overrides(tiny_model_dir, run_dir, steps=1))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return first_answers(run_dir)


def start_script(script: str, overrides: list[str], until: str) -> tuple[subprocess.Popen, list[str]]:
    """Start ``script`` in a session of its own; return once a log line contains ``until``."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "sota" / script), *overrides],
        cwd=ROOT,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    seen = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if until in line:
                seen.set()

    threading.Thread(target=read, daemon=True).start()
    if not seen.wait(timeout=300):
        proc.kill()
        pytest.fail(f"no {until!r}:\n" + "".join(lines[-60:]))
    return proc, lines


def test_sync_served_run_samples_as_in_process_and_sigterm_stops_its_server(
    tiny_model_dir, tmp_path, in_process_answers
):
    run_dir = tmp_path / "served"
    proc, lines = start_script(
        "grpo.py", [*tiny_overrides(tiny_model_dir, run_dir, steps=1000), *SERVED], until="step 2/1000 |"
    )
    try:
        sids = server_sessions("".join(lines))
        assert len(sids) == 1 and alive_in_session(sids[0])
        os.kill(proc.pid, signal.SIGTERM)  # a scheduler's preemption: the run stops at its next phase boundary
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = "".join(lines)
    assert proc.returncode == 0, log[-3000:]
    assert "1 vLLM server" in log and (run_dir / "engine_server_0.log").exists()
    assert first_answers(run_dir) == in_process_answers  # the same seed: the same samples
    assert not wait_gone(sids, 5), "the server outlived the run"


def wait_for_line(proc: subprocess.Popen, lines: list[str], text: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line for line in lines):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {text!r}:\n" + "".join(lines[-60:]))
        time.sleep(0.2)


def test_async_served_run_replaces_a_killed_server_and_leaves_none_when_the_driver_is_killed(
    tiny_model_dir, tmp_path, in_process_answers
):
    """With in-flight updates: the run's server is SIGKILLed after step 2; its collector is replaced with a new
    server, given the newest weights, and the steps go on, each batch trained once. Then the driver is SIGKILLed:
    no server outlives it."""
    run_dir = tmp_path / "killed"
    proc, lines = start_script(
        "grpo-async.py",
        [*tiny_overrides(tiny_model_dir, run_dir, steps=1000), *SERVED, "pipeline.inflight_updates=true"],
        until="step 2/1000 |",
    )
    try:
        sids = server_sessions("".join(lines))
        assert len(sids) == 1 and alive_in_session(sids[0]), "".join(lines[-60:])
        os.killpg(sids[0], signal.SIGKILL)  # the server and its engine process
        wait_for_line(proc, lines, "collector replica 0 replaced")
        steps_then = len((run_dir / "metrics.jsonl").read_text().splitlines())
        wait_for_line(proc, lines, f"step {steps_then + 2}/1000 |")
        sids = server_sessions("".join(lines))
        assert len(sids) == 2 and alive_in_session(sids[1]) and not alive_in_session(sids[0]), sids
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone: no cleanup of its own runs
        proc.wait(timeout=30)
        left = wait_gone(sids)
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # Ray's processes of the killed run
        except ProcessLookupError:
            pass
    assert not left, f"the server outlived its driver: {left}"
    # the collector drove the server: the same first batch as the synchronous in-process run
    assert first_answers(run_dir) == in_process_answers
    (restart,) = [json.loads(line) for line in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert restart["role"] == "collector" and "failed" in restart["cause"], restart
    trained = trained_groups(run_dir)  # the driver was killed: no final checkpoint to hold them against
    assert len(trained) == len(set(trained)) >= 2 * (steps_then + 2), trained
    assert (run_dir / "engine_server_0.1.log").exists()  # the replacement's log beside the first one


def test_a_server_that_dies_mid_run_is_named_and_the_last_step_is_kept(tiny_model_dir, tmp_path):
    """A server the run was given (``inference_model.urls``) goes away after two steps: the run names it in one
    line, keeps step 2 as a checkpoint and exits with 1, without hanging."""
    from tests.engine_stand_in import StandIn

    server = StandIn(key=RUN_KEY, generations=4)  # 2 prompts per step: it dies at step 3
    run_dir = tmp_path / "orphaned"
    try:
        proc = run_script(
            "grpo.py",
            *tiny_overrides(tiny_model_dir, run_dir, steps=10),
            *SERVED,
            f"inference_model.urls=[{server.url}]",
            "inference_model.request_timeout_s=30",
            "eval.every=0",
            env=script_env(GRPO_RL_ENGINE_KEY=RUN_KEY),
            timeout=300,
        )
    finally:
        server.close()
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"engine server {server.url}" in last and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (run_dir / "checkpoints" / "step_00000002").exists()
    assert not (run_dir / "engine_server_0.log").exists()  # the user's server: the run starts none
