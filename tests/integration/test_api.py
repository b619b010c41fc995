"""The Python API (grpo_rl.Trainer): the notebook example end to end on the tiny model, both loops with reward
functions given as objects, and its user errors before any engine starts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.integration.helpers import NOT_VLLM, ROOT, read_metrics, script_env, tiny_overrides

pytestmark = [pytest.mark.integration]


def run_python(code: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_the_notebook_example_trains_the_tiny_model(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny_model_dir, out, steps=2) if not o.startswith("env.")]
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "notebook_api.py"),
            *overrides,
            "env.prompts_per_step=2",
            "env.group_size=4",
        ],
        cwd=ROOT,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in read_metrics(out) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert {"reward_correct_mean", "reward_brevity_mean"} <= set(rows[0])
    assert rows[-1]["policy_version"] == 2
    assert (out / "final_model" / "model.safetensors").exists()
    assert (out / "checkpoints" / "step_00000002").is_dir()
    assert len((out / "prompts.jsonl").read_text().splitlines()) == 64
    assert "step   2  reward" in proc.stdout  # the example's own table, from RunResult.metrics


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_reward_objects_reach_both_loops(mode, tiny_model_dir, tmp_path):
    """A closure (picklable only by value) scores in the driver's collector and in the collector actors."""
    out = tmp_path / mode
    code = """
        import json, sys
        from grpo_rl import Trainer

        def make_reward(target):
            def length_near(completions, **kwargs):  # TRL's convention
                return [-abs(len(c) - target) / target for c in completions]
            return length_near

        result = Trainer(prompts=["Say hi.", "Name a colour.", "Count to three."],
                         rewards={"near": (make_reward(20), 1.0)}, overrides=sys.argv[2:], mode=sys.argv[1]).train()
        print("RESULT", json.dumps({"steps": result.steps, "final": result.final_reward}))
    """
    proc = run_python(code, mode, *tiny_overrides(tiny_model_dir, out, steps=2), "eval.every=0", NOT_VLLM)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in read_metrics(out) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward_near_mean"] < 0 for r in rows)  # the closure scored every answer (a length is never exact)
    assert all(r["reward_failures"] == 0 for r in rows)
    assert '"steps": 2' in proc.stdout


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ("rewards=lambda: 0", "rewards[0]=<lambda> has signature"),
        ("rewards=lambda responses, references, size: 0", "requires column(s) ['size']"),
        ("rewards=[42]", "rewards[0] is a int"),
        ('overrides=["optimizer.lrr=1e-5"]', "optimizer.lrr"),
        ("prompts=[]", "prompts is empty"),
        ("prompts=[1, 2]", "prompts[0] is a int"),
    ],
)
def test_user_errors_are_one_line_before_any_engine(kwargs, expected, tmp_path):
    code = f"""
        import sys
        from grpo_rl import Trainer
        from grpo_rl.errors import UserError

        args = dict(prompts=["a", "b", "c", "d"], rewards=lambda responses, references: [0.0] * len(responses),
                    overrides=["logger.backend=none"], run_dir={str(tmp_path)!r})
        args.update(dict({kwargs}))
        try:
            Trainer(**args).train()
        except UserError as e:
            print("USER ERROR", e)
        print("engine imported:", "vllm" in sys.modules)
    """
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("USER ERROR")), proc.stdout[-2000:])
    assert expected in line, line
    assert "engine imported: False" in proc.stdout


@pytest.mark.slow
def test_the_model_objects_example_trains_the_callers_model(tiny_model_dir, tmp_path):
    """examples/notebook_model_objects.py on the tiny model: the object's weights come back trained."""
    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny_model_dir, out, steps=2) if not o.startswith(("env.", "model.name"))]
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "notebook_model_objects.py"),
            str(tiny_model_dir),
            *overrides,
            "inference_model.engine=transformers",
        ],
        cwd=ROOT,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if "parameter tensors of `model` changed" in ln)
    changed, total = int(line.split()[0]), int(line.split()[2])
    assert 0 < changed <= total
    assert (out / "initial_model" / "config.json").is_file() and (out / "final_model" / "config.json").is_file()
    assert f"name: {out / 'initial_model'}" in (out / "checkpoints" / "step_00000002" / "config.yaml").read_text()


@pytest.mark.slow
def test_model_objects_reach_every_role_and_the_weights_come_back(tiny_model_dir, tmp_path):
    """model=, tokenizer=, ref_model= (another random model: the KL to it is not 0 at the first step, where the
    policy still equals its initial weights) and reward_model= (a sequence classifier) as objects, through the
    synchronous loop; the caller's model object ends holding the exported final weights."""
    out = tmp_path / "run"
    code = f"""
        import json, sys
        import torch
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
        from grpo_rl import Trainer

        folder = {str(tiny_model_dir)!r}
        model = AutoModelForCausalLM.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        torch.manual_seed(1)
        reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
        config = AutoConfig.from_pretrained(folder, num_labels=1, pad_token_id=tokenizer.eos_token_id)
        reward_model = AutoModelForSequenceClassification.from_config(config)
        before = {{k: v.clone() for k, v in model.state_dict().items()}}
        result = Trainer(model=model, tokenizer=tokenizer, ref_model=reference, reward_model=reward_model,
                         reward_tokenizer=tokenizer, prompts=["Say hi.", "Name a colour.", "Count to three."],
                         overrides=sys.argv[1:]).train()
        final = load_file(str(result.final_model / "model.safetensors"))
        state = model.state_dict()
        print("RESULT", json.dumps({{
            "equal_final": all(torch.equal(state[k], v) for k, v in final.items()),
            "changed": sum(not torch.equal(before[k], state[k]) for k in final),
        }}))
    """
    proc = run_python(
        code,
        *tiny_overrides(tiny_model_dir, out, steps=2),
        "eval.every=0",
        "policy.kl_coef=0.1",
        "inference_model.engine=transformers",
        "env.ground_truth_column=null",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT ") :])
    assert result["equal_final"] and result["changed"] > 0
    rows = [r for r in read_metrics(out) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["kl_ref"] > 1e-3  # a fresh policy against another random model; 0 against its own weights
    assert "reward_model_mean" in rows[0]
    config = (out / "checkpoints" / "step_00000002" / "config.yaml").read_text()
    for folder in ("initial_model", "reference_model", "reward_model"):
        assert (out / folder / "config.json").is_file()
        assert str(out / folder) in config
