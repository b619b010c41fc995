"""The prompt token cache: the same ids as tokenizing, read back on the next build, keyed by texts and tokenizer."""

from __future__ import annotations

import copy

import pytest

from grpo_rl.envs import prompt_tokens


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(prompt_tokens, "MIN_PROMPTS", 2)
    return tmp_path / "prompt_tokens"


def _texts(n: int = 5) -> list[str]:
    return [f"<|im_start|>user\nWhat is {i} + {i * 7}? Café, naïve — {i}<|im_end|>\n" for i in range(n)]


def _no_tokenizing(*args):
    raise AssertionError("tokenized although the cache holds the ids")


def test_a_second_build_reads_the_ids_back(tokenizer, cache, monkeypatch):
    texts = _texts()
    first = prompt_tokens.tokenize_prompts(tokenizer, texts)
    assert first == [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert len(list(cache.glob("*.npz"))) == 1
    monkeypatch.setattr(prompt_tokens, "_tokenize", _no_tokenizing)
    assert prompt_tokens.tokenize_prompts(tokenizer, texts) == first


def test_other_texts_or_another_tokenizer_are_other_entries(tokenizer, cache):
    texts = _texts()
    prompt_tokens.tokenize_prompts(tokenizer, texts)
    prompt_tokens.tokenize_prompts(tokenizer, [*texts[:-1], texts[-1] + " "])
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["Café"])  # the same name, another vocabulary
    ids = prompt_tokens.tokenize_prompts(other, texts)
    assert ids == [other.encode(t, add_special_tokens=False) for t in texts]
    assert ids != prompt_tokens._tokenize(tokenizer, texts)
    assert len(list(cache.glob("*.npz"))) == 3


def test_a_damaged_entry_is_tokenized_again_and_replaced(tokenizer, cache, monkeypatch):
    texts = _texts()
    expected = prompt_tokens.tokenize_prompts(tokenizer, texts)
    (entry,) = cache.glob("*.npz")
    entry.write_bytes(entry.read_bytes()[:100])
    assert prompt_tokens.tokenize_prompts(tokenizer, texts) == expected
    monkeypatch.setattr(prompt_tokens, "_tokenize", _no_tokenizing)
    assert prompt_tokens.tokenize_prompts(tokenizer, texts) == expected  # the rewritten entry reads back


def test_small_sets_and_a_switched_off_cache_write_nothing(tokenizer, cache, monkeypatch):
    prompt_tokens.tokenize_prompts(tokenizer, _texts(1))  # under MIN_PROMPTS
    monkeypatch.setenv("GRPO_PROMPT_TOKEN_CACHE", "0")
    assert prompt_tokens.tokenize_prompts(tokenizer, _texts()) == prompt_tokens._tokenize(tokenizer, _texts())
    assert not cache.exists()


def test_only_the_newest_entries_are_kept(tokenizer, cache, monkeypatch):
    monkeypatch.setattr(prompt_tokens, "KEEP", 2)
    for n in (2, 3, 4):
        prompt_tokens.tokenize_prompts(tokenizer, _texts(n))
    assert len(list(cache.glob("*.npz"))) == 2 and not list(cache.glob(".tmp-*"))
