"""Running the entry scripts as subprocesses, the way a user does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# Metrics both loops log under the same names for the same quantities (timings per step, rates, failures).
SHARED_STEP_METRICS = (
    "reward_mean",
    "reward_failures",
    "kl_ref",
    "clip_fraction",
    "ess",
    "entropy",
    "grad_norm",
    "lr",
    "generation_seconds",
    "reward_seconds",
    "generation_tokens_per_second",
    "reference_seconds",
    "training_seconds",
    "weight_sync_seconds",
    "step_seconds",
    "tokens_per_second",
    "response_length_mean",
    "advantage_mean",
    "zero_variance_groups",
    "policy_version",
)


def script_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    # Set in this process by an in-process vLLM engine of an earlier test (its CPU worker's identity); a script's own
    # vLLM would warn about it as an unknown variable.
    env.pop("VLLM_DIST_IDENT", None)
    # Unset (scripts/env.sh sets it for a shell): the scripts run at the library's own vLLM log level
    # (grpo_rl/quiet.py), which is what the quiet-start checks (start_up_noise) are about.
    env.pop("VLLM_LOGGING_LEVEL", None)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        WANDB_MODE="offline",
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
    )
    # One thread per process, as the tests' own (tests/conftest.py): a script sizes its roles' threads from this, so
    # two test workers on a 2-core machine never run 2-thread OpenMP against each other (10 to 30x slower).
    env.setdefault("OMP_NUM_THREADS", os.environ.get("GRPO_TEST_THREADS", "1"))
    shared = ROOT.parent / "shared" / "data"
    if "GRPO_DATA_DIR" not in env and shared.exists():
        env["GRPO_DATA_DIR"] = str(shared)
    return env


_OWN_LINE = re.compile(r"^\[[^\]]+\]\[grpo_rl\.")


def start_up_noise(proc: subprocess.CompletedProcess) -> list[str]:
    """What a run printed before its first step besides its own log lines (the banner and its indented lines, the
    data lines, Ray's start) and torch's one note on NUMA binding (from vLLM's CPU worker, in C++, past Python's
    logging); all of stderr counts, so a short run's warnings after the first step count too. Notes about the machine
    rather than the run (Ray's warning that the disk is nearly full) are not noise."""
    out = proc.stdout.splitlines()
    first = next(
        (i for i, line in enumerate(out) if re.search(r"\]\[grpo_rl\.run\.stopping\].* step 1/", line)), len(out)
    )
    noise = [line for line in out[:first] if line.strip() and not _OWN_LINE.match(line) and not line.startswith("  ")]
    noise += [line for line in proc.stderr.splitlines() if line.strip() and "NUMA binding" not in line]
    return [line for line in noise if "file_system_monitor" not in line]


# For runs whose subject is not the engine: the in-process transformers engine starts at once where vLLM takes
# about 8 s (per script, and per collector actor of the asynchronous loop). The default engine runs in the scripts'
# own tests (test_sync_script.py, test_async.py, test_resume.py, test_served_*.py, test_tool_learning.py, ...).
NOT_VLLM = "inference_model.engine=transformers"


def tiny_overrides(model_dir: Path, out_dir: Path, steps: int = 2) -> list[str]:
    return [
        f"model.name={model_dir}",
        f"output_dir={out_dir}",
        f"train.steps={steps}",
        "logger.backend=none",
        "sampling.max_new_tokens=16",
        "env.prompts_per_step=2",
        "env.group_size=4",
        "inference_model.kv_cache_gb=1",
        "inference_model.max_model_len=512",
        # What a run does by default but these runs' subjects are not: a held-out evaluation after the last step (tests
        # of evaluation set eval.every), and in the asynchronous loop the reference as a stage of its own, two more
        # processes (its tests: test_async.py, test_healing.py). Each would cost every run seconds of CPU.
        "eval.every=0",
        "ref_model.placement=learner",
        # the same arithmetic on every CPU kind (auto would pick bf16 where it is fast)
        "train_model.precision=float32",
        "ref_model.precision=float32",
        "inference_model.precision=float32",
    ]


def run_script(
    script: str, *overrides: str, timeout: float = 600, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "sota" / script), *overrides],
        cwd=cwd or ROOT,
        env=env or script_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


# A reward function that fails on every other call (in each process): for the failure paths.
FLAKY_REWARD = """
_calls = 0

def flaky(responses, references):
    global _calls
    _calls += 1
    if _calls % 2:
        raise RuntimeError(f"flaky call {_calls}")
    return [1.0] * len(responses)
"""


def trained_groups(run_dir: Path) -> list[int]:
    """The stream's group indices trained on, step by step and in each step's row order, from trained.jsonl."""
    from grpo_rl.run.metrics import read_jsonl

    return [g for r in read_jsonl(run_dir / "trained.jsonl") for g in r["group_group_index"]]


def assert_groups_trained_once(run_dir: Path) -> list[int]:
    """No group of the stream trained twice, and the final checkpoint's stream position holds exactly the groups
    trained (every one below its watermark, and those above it recorded consumed). Returns the trained groups."""
    from grpo_rl.run.checkpoint import Checkpointer, load_trainer_state

    trained = trained_groups(run_dir)
    assert len(trained) == len(set(trained)), f"a group trained twice: {trained}"
    stream = load_trainer_state(Checkpointer(run_dir).latest())["env"]
    assert set(range(stream["next_group"])) | set(stream["consumed_groups"]) == set(trained), (trained, stream)
    return trained


def lora_learner(model_dir: Path):
    """A tiny LoRA learner (r=4, alpha=8 on q, v and down) that pushes its adapter alone: ``(model, learner)``."""
    import torch

    from grpo_rl.model.loading import load_causal_lm
    from grpo_rl.model.lora import apply_lora
    from grpo_rl.training.learner import Learner, LossSettings

    torch.manual_seed(0)
    model = load_causal_lm(str(model_dir), torch.device("cpu"), "float32", trainable=True)
    model = apply_lora(model, r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    return model, Learner(model, torch.device("cpu"), LossSettings(), lr=1e-3, push_adapter=True)


def follow_adapter_pushes(engine, push, model, learner, prompts: list[list[int]]) -> list:
    """Generate with ``engine`` before and after each of two adapter pushes (``push(weights, version)``) of
    ``learner``'s perturbed adapter: every batch's log-probs must be the LoRA model's (1e-4, fp32), and each push
    must change them. Returns the batches after the pushes (versions 1 and 2)."""
    import torch

    from grpo_rl.engines.base import SamplingSpec
    from grpo_rl.model.logprobs import sequence_logprobs

    spec = SamplingSpec(max_new_tokens=24, temperature=0.8, seed=3)

    def gap(batch) -> float:
        with torch.no_grad():
            mine = sequence_logprobs(model, batch, temperature=0.8).logprobs
        return float(((mine - batch["behavior_logprobs"]).abs() * batch["response_mask"]).max())

    base = engine.generate(prompts, 3, spec)
    assert gap(base) < 1e-4  # B = 0: the adapter changes nothing yet
    afters = []
    for version in (1, 2):
        torch.manual_seed(version)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.add_(0.05 * torch.randn_like(p))
        pushed = learner.weights_for_push()
        assert all(".lora_" in name for name, _ in pushed)
        push(pushed, version)
        after = engine.generate(prompts, 3, spec)  # the same prompts and seed: only the adapter differs
        assert gap(after) < 1e-4, f"engine and learner disagree after adapter push {version}"
        assert not torch.equal(base["behavior_logprobs"], after["behavior_logprobs"])
        afters.append(after)
    return afters
