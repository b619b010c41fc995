"""A two-job Hydra sweep of the synchronous script on a tiny model, then its summary table and curves.

Run in a fresh working directory with no ``output_dir``, so Hydra's default layout is what is checked:
``multirun/DATE/TIME/<job>/`` with ``.hydra/config.yaml``, ``checkpoints/`` and ``final_model/``. The jobs also
evaluate once (``eval.every``), write CSV and TensorBoard logs, and log to wandb, which must run offline (no
API key) and write under the job folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.integration.helpers import NOT_VLLM

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.setdefault("GRPO_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def test_two_job_sweep_then_summary_and_plot(tiny_model_dir: Path, tmp_path: Path):
    for module in ("wandb", "tensorboard", "matplotlib"):
        pytest.importorskip(module)
    cmd = [
        sys.executable,
        str(ROOT / "sota" / "grpo.py"),
        "--multirun",
        "optimizer.lr=1e-4,1e-5",
        f"model.name={tiny_model_dir}",
        "train.steps=2",
        "sampling.max_new_tokens=8",
        "env.prompts_per_step=2",
        "env.group_size=2",
        "inference_model.max_model_len=512",
        "inference_model.kv_cache_gb=1",
        "env.max_prompt_tokens=300",
        "eval.every=2",
        "eval.num_prompts=2",
        "eval.pass_k=2",
        "logger.backend=wandb",
        "logger.csv=true",
        "logger.tensorboard=true",
        NOT_VLLM,
    ]
    done = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]

    sweeps = list((tmp_path / "multirun").glob("*/*"))
    assert len(sweeps) == 1, f"expected multirun/DATE/TIME, found {sweeps}"
    sweep = sweeps[0]
    for job, lr in (("0", 1e-4), ("1", 1e-5)):
        job_dir = sweep / job
        assert OmegaConf.load(job_dir / ".hydra" / "config.yaml").optimizer.lr == lr
        assert (job_dir / "checkpoints" / "step_00000002" / "trainer_state.pt").exists()
        assert (job_dir / "final_model" / "model.safetensors").exists()
        assert (job_dir / "metrics.csv").exists() and list((job_dir / "tensorboard").glob("events.out.tfevents.*"))
        assert list((job_dir / "wandb").glob("offline-run-*/*.wandb")), "wandb did not write offline under the job"

    summary = subprocess.run(
        [sys.executable, "-m", "grpo_rl.cli.sweep_summary", str(sweep)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("job"))
    assert lines[header].split()[:3] == ["job", "optimizer.lr", "steps"]
    rows = [line.split() for line in lines[header + 2 :]]
    assert [r[:3] for r in rows] == [["0", "0.0001", "2"], ["1", "1e-05", "2"]]
    assert all(r[4] != "-" and r[-1] == "yes" for r in rows)  # accuracy measured, run finished

    png = tmp_path / "sweep.png"
    plot = subprocess.run(
        [sys.executable, "-m", "grpo_rl.cli.plot", str(sweep), "--out", str(png)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plot.returncode == 0, plot.stderr
    assert png.stat().st_size > 10_000
