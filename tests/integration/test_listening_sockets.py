"""Nothing a run starts listens beyond loopback on one machine: its local Ray instance, the learner group's
rendezvous and gloo connections, the weight broadcast's. Sampled from /proc while a short run lives.

The run is the asynchronous script with two learner ranks and the collective weight transport, so every rendezvous
the library hosts is up at once; the transformers engine stands in for vLLM (the engine is not the subject). With
``GLOO_SOCKET_IFNAME`` naming a non-loopback interface in the run's environment, gloo's default device would bind
beyond loopback (this machine's host name may resolve to 127.0.0.1, where it would pass by luck).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.helpers import NOT_VLLM, ROOT, script_env
from tests.sockets import command_line, listening_of, non_loopback_ipv4, pids_with_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _overrides(model_dir: Path, run_dir: Path) -> list[str]:
    return [
        f"model.name={model_dir}",
        f"output_dir={run_dir}",
        "train.steps=1",
        "logger.backend=none",
        "logger.num_examine=0",
        "env.prompts_per_step=2",
        "env.group_size=4",
        "sampling.max_new_tokens=8",
        "policy.kl_coef=0.0",
        "eval.every=0",
        "train.checkpoint_frequency=0",
        "inference_model.max_model_len=512",
        "train_model.precision=float32",
        "ref_model.precision=float32",
        "inference_model.precision=float32",
        NOT_VLLM,
        "train_model.num_devices=2",
        "pipeline.weight_transport=collective",
    ]


def test_async_run_with_two_learner_ranks_listens_on_loopback_only(tiny_model_dir, tmp_path):
    marker = uuid.uuid4().hex
    env = script_env(GRPO_LISTENING_TEST=marker)  # the run's processes, Ray's included, inherit it
    tempting = non_loopback_ipv4()
    if tempting is not None:
        env["GLOO_SOCKET_IFNAME"] = tempting[0]
    seen: dict[str, str] = {}  # "tcp 127.0.0.1:port" -> the command line of the process that held it
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "sota" / "grpo-async.py"), *_overrides(tiny_model_dir, tmp_path / "run")],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                for pid, sockets in listening_of(pids_with_env(f"GRPO_LISTENING_TEST={marker}")).items():
                    for s in sockets:
                        seen.setdefault(str(s) + ("" if s.loopback else " BEYOND LOOPBACK"), command_line(pid))
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == 0, (tmp_path / "out.txt").read_text()[-6000:]
    beyond = {s: owner for s, owner in seen.items() if s.endswith("BEYOND LOOPBACK")}
    assert beyond == {}, "\n".join(f"{s}  {owner}" for s, owner in beyond.items())
    owners = " ".join(seen.values())
    for process in ("gcs_server", "raylet", "LearnerRank", "CollectorWorker", "grpo-async.py"):
        assert process in owners, f"no listening socket of {process} was seen: {seen}"  # the sampling saw the run
