"""A reward function's bad behaviour costs its samples, not the run: NumPy numbers, time limits, sys.exit,
huge GSM8K answers and huge texts in the failure log."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grpo_rl.envs.rewards.base import (
    MAX_ABANDONED_CALLS,
    MAX_EXAMPLE_CHARS,
    MAX_RETRY_TIMEOUTS,
    CompositeReward,
    RewardComponent,
    RewardError,
)
from grpo_rl.envs.rewards.custom import RewardLoadError, user_reward_components
from grpo_rl.envs.tasks.gsm8k.reward import correctness_reward, normalize_number

RESPONSES = ["a", "b", "c"]
REFS = [None, None, None]


def exact(responses, references):
    return [1.0 for _ in responses]


def _values(fn, **kwargs) -> torch.Tensor:
    out = CompositeReward([RewardComponent("r", fn, **kwargs)])(RESPONSES, REFS)
    assert out.failures == {}, out.failure_examples
    return out.components["r"]


# NumPy numbers


@pytest.mark.parametrize("kind", [np.float32, np.float64, np.int64, np.int8, np.bool_])
def test_numpy_scalars_are_numbers(kind):
    values = _values(lambda responses, references: [kind(1), kind(0), kind(1)])
    torch.testing.assert_close(values, torch.tensor([1.0, 0.0, 1.0]))


@pytest.mark.parametrize(
    "array", [np.array([0.5, 1.0, 2.0], dtype=np.float32), np.array([True, False, True]), np.arange(3)]
)
def test_numpy_arrays_are_numbers(array):
    values = _values(lambda responses, references: array)
    torch.testing.assert_close(values, torch.tensor(array.astype(np.float32)))


def test_python_bools_are_numbers():
    torch.testing.assert_close(_values(lambda r, ref: [True, False, True]), torch.tensor([1.0, 0.0, 1.0]))


@pytest.mark.parametrize("bad", [[np.float32("nan")] * 3, ["1.0"] * 3, [10**400] * 3, "abc", 1.0])
def test_non_numbers_still_fail(bad):
    reward = CompositeReward([RewardComponent("bad", lambda r, ref: bad)])
    with pytest.raises(
        RewardError,
        match=r"'bad' \(tests/unit/envs/test_reward_robustness.py:"
        r"test_non_numbers_still_fail\.<locals>\.<lambda>\) failed on every sample",
    ):
        reward(RESPONSES, REFS)


# Time limits


@pytest.fixture
def release():
    """Lets the abandoned threads of a test finish once it is over."""
    event = threading.Event()
    yield event
    event.set()


def test_a_call_past_the_time_limit_fails_its_samples_and_the_run_goes_on(release):
    calls = []

    def stuck(responses, references):
        calls.append(len(responses))
        release.wait(30)
        return [1.0] * len(responses)

    reward = CompositeReward(
        [RewardComponent("exact", exact), RewardComponent("stuck", stuck, 1.0, timeout_seconds=0.2)], fallback=-1.0
    )
    out = reward(RESPONSES, REFS)  # no RewardError: a time-out is not a broken function
    # the batch call and MAX_RETRY_TIMEOUTS retries, not one per sample; all abandoned while they still wait
    assert calls == [3] + [1] * MAX_RETRY_TIMEOUTS and not release.is_set()
    assert len(reward._abandoned["stuck"]) == 1 + MAX_RETRY_TIMEOUTS
    torch.testing.assert_close(out.components["stuck"], torch.tensor([-1.0, -1.0, -1.0]))
    torch.testing.assert_close(out.total, torch.tensor([0.0, 0.0, 0.0]))
    assert out.failures == {"stuck": 3}
    assert all(e["timed_out"] for e in out.failure_examples)
    assert "timed out after" in out.failure_examples[0]["error"]
    assert "reward.timeout_seconds" in out.failure_examples[0]["error"]


def test_a_single_slow_sample_is_isolated(release):
    def slow_on_b(responses, references):
        if "b" in responses:
            release.wait(30)
        return [1.0] * len(responses)

    out = CompositeReward([RewardComponent("slow", slow_on_b, timeout_seconds=0.3)])(RESPONSES, REFS)
    torch.testing.assert_close(out.components["slow"], torch.tensor([1.0, 0.0, 1.0]))
    assert out.failures == {"slow": 1}
    assert out.failure_examples[0]["index"] == 1 and out.failure_examples[0]["response"] == "b"


def test_a_stuck_function_is_not_called_again_while_its_calls_still_run(release):
    calls = []

    def stuck(responses, references):
        calls.append(len(responses))
        release.wait(30)
        return [1.0] * len(responses)

    reward = CompositeReward([RewardComponent("stuck", stuck, timeout_seconds=0.1)])
    many = ["r"] * 8
    reward(many, [None] * 8)
    # The batch call and MAX_RETRY_TIMEOUTS retries were abandoned; the other samples were not retried.
    assert calls == [8] + [1] * MAX_RETRY_TIMEOUTS
    reward(many, [None] * 8)
    assert len(calls) == 2 * (1 + MAX_RETRY_TIMEOUTS) and 2 * (1 + MAX_RETRY_TIMEOUTS) >= MAX_ABANDONED_CALLS
    out = reward(many, [None] * 8)  # enough calls still run: this step does not call, so does not wait, at all
    assert len(calls) == len(reward._abandoned["stuck"]) == 2 * (1 + MAX_RETRY_TIMEOUTS)
    assert out.failures == {"stuck": 8} and "still running" in out.failure_examples[0]["error"]
    release.set()
    for thread in reward._abandoned["stuck"]:
        thread.join(10)
    out = reward(many, [None] * 8)  # they returned: the function is called again
    assert len(calls) == 2 * (1 + MAX_RETRY_TIMEOUTS) + 1 and out.failures == {}


def test_a_single_sample_step_that_times_out_goes_on(release):
    def stuck(responses, references):
        release.wait(30)

    out = CompositeReward([RewardComponent("stuck", stuck, timeout_seconds=0.1)])(["a"], [None])
    assert out.failures == {"stuck": 1} and out.failure_examples[0]["timed_out"]


def test_fast_functions_under_a_limit_are_unchanged():
    values = _values(lambda r, ref: [0.25] * len(r), timeout_seconds=10.0)
    torch.testing.assert_close(values, torch.tensor([0.25] * 3))


def test_errors_raised_under_a_limit_are_isolated_as_before():
    def digits(responses, references):
        return [float(int(r)) for r in responses]

    out = CompositeReward([RewardComponent("d", digits, timeout_seconds=10.0)])(["1", "x", "3"], REFS)
    torch.testing.assert_close(out.components["d"], torch.tensor([1.0, 0.0, 3.0]))
    assert "ValueError" in out.failure_examples[0]["error"] and "timed_out" not in out.failure_examples[0]


def test_timeout_comes_from_the_config(tmp_path):
    file = tmp_path / "r.py"
    file.write_text("def f(responses, references):\n    return [1.0] * len(responses)\n")
    cfg = SimpleNamespace(path=str(file), name="f", functions=[], timeout_seconds=7.5)
    [component] = user_reward_components(cfg)
    assert component.timeout_seconds == 7.5
    cfg.timeout_seconds = None
    assert user_reward_components(cfg)[0].timeout_seconds is None
    cfg.timeout_seconds = 0
    with pytest.raises(RewardLoadError, match="reward.timeout_seconds=0 must be > 0"):
        user_reward_components(cfg)


# sys.exit and other exits


@pytest.mark.parametrize("timeout", [None, 10.0])
def test_sys_exit_is_a_failure_not_the_end(timeout):
    def exits(responses, references):
        if "b" in responses:
            sys.exit(3)
        return [1.0] * len(responses)

    out = CompositeReward([RewardComponent("exits", exits, timeout_seconds=timeout)])(RESPONSES, REFS)
    torch.testing.assert_close(out.components["exits"], torch.tensor([1.0, 0.0, 1.0]))
    assert out.failures == {"exits": 1}
    assert "called sys.exit()" in out.failure_examples[0]["error"]


def test_sys_exit_on_every_sample_is_a_reward_error():
    def exits(responses, references):
        sys.exit(0)

    with pytest.raises(RewardError, match="called sys.exit"):
        CompositeReward([RewardComponent("exits", exits)])(RESPONSES, REFS)


def test_other_base_exceptions_are_failures():
    class Abort(BaseException):
        pass

    def aborts(responses, references):
        if "c" in responses:
            raise Abort("stop")
        return [1.0] * len(responses)

    out = CompositeReward([RewardComponent("aborts", aborts)])(RESPONSES, REFS)
    assert out.failures == {"aborts": 1} and "Abort('stop')" in out.failure_examples[0]["error"]


@pytest.mark.parametrize("timeout", [None, 10.0])
def test_keyboard_interrupt_still_stops_the_run(timeout):
    def interrupted(responses, references):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        CompositeReward([RewardComponent("k", interrupted, timeout_seconds=timeout)])(RESPONSES, REFS)


def test_sys_exit_while_importing_a_reward_file(tmp_path):
    file = tmp_path / "r.py"
    file.write_text("import sys\nsys.exit(1)\n")
    cfg = SimpleNamespace(path=str(file), name="f", functions=[], timeout_seconds=None)
    with pytest.raises(RewardLoadError, match="importing the file called sys.exit"):
        user_reward_components(cfg)


# GSM8K answers past Python's integer-string limit


def test_gsm8k_answer_with_too_many_digits_scores_zero():
    huge = "9" * 5000
    assert normalize_number(huge) is None and normalize_number(f"1/{huge}") is None
    assert correctness_reward([huge, f"#### {huge}", f"The answer is 0.{huge}", "#### 5"], ["5"] * 4) == [
        0.0,
        0.0,
        0.0,
        1.0,
    ]


# Failure texts are cut


def test_huge_response_and_error_are_cut_in_the_log_and_the_record(caplog):
    def loud(responses, references):
        if responses[0].startswith("x"):
            raise ValueError("y" * 50_000)
        return [1.0] * len(responses)

    response = "x" * 100_000
    with caplog.at_level("WARNING", logger="grpo_rl.envs.rewards.base"):
        out = CompositeReward([RewardComponent("loud", loud)])([response, "ok"], [None, None])
    [example] = out.failure_examples
    assert len(example["response"]) < MAX_EXAMPLE_CHARS + 40 and example["response"].endswith("[100000 chars]")
    assert len(example["error"]) < MAX_EXAMPLE_CHARS + 40 and "chars]" in example["error"]
    assert len(caplog.text) < 4 * MAX_EXAMPLE_CHARS
