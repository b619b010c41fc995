"""Kill-and-resume equivalence of the synchronous script.

Run A trains a tiny model for 6 steps without interruption. Run B is the same run with a checkpoint after every
step; it is stopped at a random moment inside a step (after step k appears in metrics.jsonl, at a random delay),
by SIGKILL (nothing runs after it) or by SIGTERM (a scheduler's preemption: the script must abandon or finish
the step, checkpoint its last completed step and exit 0), then restarted with ``resume=auto`` in the same folder. B's
metrics.jsonl must then hold each step once, with the same losses, rewards and diagnostics as A's, and B's final weights
must equal A's bit for bit. Both evaluate every 2 steps on the same engine, which must not disturb training (and gives
the same results).

The reward is a user reward function (the share of the answer's letters in a-m) added to GSM8K's: a random
tiny model never earns GSM8K's reward, and with all-zero rewards every update is zero and nothing would be
tested. The kill point is drawn from ``GRPO_TEST_KILL_SEED`` (default: random) and printed, so a failure can
be replayed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import assert_groups_trained_once, trained_groups

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
COMPARED = (
    "eval/accuracy",
    "eval/pass@2",
    "eval/reward_mean",
    "eval/reward_early_letters_mean",
    "loss",
    "loss_policy",
    "loss_kl",
    "reward_mean",
    "reward_std",
    "reward_early_letters_mean",
    "entropy",
    "grad_norm",
    "kl_ref",
    "kl_approx",
    "lr",
    "advantage_mean",
    "advantage_abs_max",
    "response_length_mean",
    "policy_version",
)

REWARD_FILE = """
def early_letters(responses, references):
    letters = [[c for c in r.lower() if "a" <= c <= "z"] for r in responses]
    return [sum(c <= "m" for c in ls) / max(1, len(ls)) for ls in letters]
"""


def _env() -> dict[str, str]:
    # One thread per run: every run must use the same count for the results to match bit for bit.
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.setdefault("GRPO_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _args(model_dir: Path, reward_file: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "sota" / "grpo.py"),
        f"model.name={model_dir}",
        f"output_dir={out}",
        f"train.steps={STEPS}",
        "seed=3",
        "logger.backend=none",
        "sampling.max_new_tokens=12",
        "env.prompts_per_step=2",
        "env.group_size=4",
        "optimizer.lr=3e-3",
        "optimizer.warmup_steps=2",
        "policy.kl_coef=0.05",
        "inference_model.max_model_len=512",
        "inference_model.kv_cache_gb=1",
        "env.max_prompt_tokens=300",
        f"reward.path={reward_file}",
        "reward.name=early_letters",
        "logger.examine_every=1",
        "eval.every=2",
        "eval.num_prompts=2",
        "eval.pass_k=2",
        *extra,
    ]


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


@pytest.fixture(scope="module")
def peaked_model_dir(tokenizer_dir, tmp_path_factory) -> Path:
    """A tiny model whose answers vary in their letters, so that the reward varies within groups."""
    from grpo_rl.model.loading import build_tiny_model

    return build_tiny_model(str(tokenizer_dir), tmp_path_factory.mktemp("peaked"), initializer_range=1.0)


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("reward") / "reward.py"
    path.write_text(REWARD_FILE)
    return path


@pytest.fixture(scope="module")
def uninterrupted(peaked_model_dir: Path, reward_file: Path, tmp_path_factory) -> Path:
    """Run A: the same run, never stopped."""
    a_dir = tmp_path_factory.mktemp("a")
    done = subprocess.run(
        _args(peaked_model_dir, reward_file, a_dir), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    a = _metrics(a_dir)
    assert [r["step"] for r in a] == list(range(1, STEPS + 1))
    assert any(r["grad_norm"] > 0 for r in a), "no step updated the weights: the test would prove nothing"
    return a_dir


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_stop_and_resume_matches_uninterrupted_run(
    peaked_model_dir: Path, reward_file: Path, uninterrupted: Path, tmp_path: Path, sig: signal.Signals
):
    seed = int(os.environ.get("GRPO_TEST_KILL_SEED", random.SystemRandom().randrange(10**6)))
    rng = random.Random(seed)
    kill_after, delay_fraction = rng.randint(2, 4), rng.random()  # step 1 is slow (first generate)
    print(f"GRPO_TEST_KILL_SEED={seed}: {sig.name} after step {kill_after} + {delay_fraction:.2f} of a step")

    # Run B: checkpoint every step, stopped by `sig` inside step kill_after + 1.
    b_dir, b_log = tmp_path / "b", tmp_path / "b_stopped.log"
    with open(b_log, "w") as fb:
        run_b = subprocess.Popen(
            _args(peaked_model_dir, reward_file, b_dir, "train.checkpoint_frequency=1"),
            cwd=ROOT,
            env=_env(),
            stdout=fb,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 500
            while _logged_steps(b_dir) < kill_after and run_b.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            last = _metrics(b_dir)[-1] if _logged_steps(b_dir) else {"step_seconds": 1.0}
            time.sleep(delay_fraction * last["step_seconds"])
            assert run_b.poll() is None, f"run B ended before it could be stopped:\n{b_log.read_text()[-3000:]}"
            if sig == signal.SIGKILL:
                os.killpg(run_b.pid, sig)
                run_b.wait(timeout=60)
            else:  # a scheduler's preemption: the script itself must stop cleanly
                os.kill(run_b.pid, sig)
                assert run_b.wait(timeout=120) == 0, b_log.read_text()[-4000:]
        finally:
            if run_b.poll() is None:
                os.killpg(run_b.pid, signal.SIGKILL)
                run_b.wait(timeout=60)
    stopped_at = _logged_steps(b_dir)
    assert stopped_at < STEPS, "run B finished before the stop"
    checkpoints = sorted(p.name for p in (b_dir / "checkpoints").glob("step_*"))
    print(f"stopped with {stopped_at} steps logged; checkpoints: {checkpoints}")
    if sig == signal.SIGTERM:
        log = b_log.read_text()
        assert "stopped: SIGTERM received" in log, log[-3000:]
        # The last completed step is both logged and checkpointed: never one without the other.
        assert checkpoints[-1] == f"step_{stopped_at:08d}"
        assert "Traceback" not in log

    # Run B, resumed.
    done = subprocess.run(
        _args(peaked_model_dir, reward_file, b_dir, "train.checkpoint_frequency=1", "resume=auto"),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "resumed from" in done.stdout + done.stderr
    a, b = _metrics(uninterrupted), _metrics(b_dir)

    assert [r["step"] for r in b] == list(range(1, STEPS + 1)), "duplicate, missing or garbled steps after resume"
    for ra, rb in zip(a, b, strict=True):
        for key in COMPARED:
            if key.startswith("eval/") and ra["step"] % 2:
                assert key not in ra and key not in rb
                continue
            assert key in ra, f"{key} is not logged"
            assert rb[key] == pytest.approx(ra[key], rel=1e-6, abs=1e-6), (
                f"step {ra['step']}: {key} differs after resume ({rb[key]} vs {ra[key]})"
            )
    # the stream, group by group: the same groups, each once, in the same steps
    assert trained_groups(b_dir) == trained_groups(uninterrupted) == list(range(2 * STEPS))
    assert_groups_trained_once(b_dir)
    samples_b = [json.loads(line)["step"] for line in (b_dir / "samples.jsonl").read_text().splitlines()]
    assert samples_b == sorted(samples_b) and len(samples_b) == len(set(samples_b)) * 2

    from safetensors.torch import load_file

    wa = load_file(uninterrupted / "final_model" / "model.safetensors")
    wb = load_file(b_dir / "final_model" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        assert (wa[name] == wb[name]).all(), f"final weight {name} differs after resume"
