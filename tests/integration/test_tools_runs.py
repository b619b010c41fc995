"""--config-name grpo_gsm8k_tools in both scripts on the tiny model: multi-turn episodes run end to end and their
metrics are logged; a user's tool file that cannot work fails at start-up with one line."""

from __future__ import annotations

import pytest

from tests.integration.helpers import NOT_VLLM, read_metrics, run_script, tiny_overrides

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOOL_METRICS = {"turns_mean", "tool_calls_mean", "tool_call_rate", "tool_errors"}


@pytest.mark.parametrize("script", ["grpo.py", "grpo-async.py"])
def test_tool_config_runs_in_both_scripts(script, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = run_script(
        script,
        "--config-name",
        "grpo_gsm8k_tools",
        *tiny_overrides(tiny_model_dir, out, steps=2),
        "eval.every=0",
        NOT_VLLM,
    )  # vLLM's multi-turn runs: test_tool_learning.py
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert TOOL_METRICS <= set(rows[0])
    assert all(1 <= r["turns_mean"] <= 3 for r in rows)


def test_a_bad_tool_file_fails_before_any_engine(tmp_path):
    (tmp_path / "tools.py").write_text("def lookup(*args):\n    '''Look it up.'''\n    return 'x'\n")
    proc = run_script(
        "grpo.py",
        f"output_dir={tmp_path / 'run'}",
        "logger.backend=none",
        "env.max_turns=2",
        f"env.tools=[{{path: {tmp_path / 'tools.py'}, name: lookup}}]",
        timeout=120,
    )
    assert proc.returncode == 2
    assert "env.tools[0]" in proc.stderr and "Traceback" not in proc.stderr
