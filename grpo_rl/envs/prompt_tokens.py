"""The token ids of a data set's chat-formatted prompts, computed once per data set and tokenizer and kept on disk.

An environment needs every prompt's length when it is built (over-long prompts are skipped, and the prompt stream is
a permutation of the rest), so it tokenizes the whole data set: GSM8K's 7,473 training prompts took 2.5 s one by one
and 1.8 s batched on a 2-core AMD EPYC (AVX2), in every process that builds the environment, every run. The ids are
a pure function of the rendered texts and the tokenizer, so they are cached under a key that is the SHA-256 of both
(the tokenizer's full serialisation, not its name: a changed vocabulary or normaliser is another key). A hit reads
one ``.npz`` file of the ids laid end to end and their offsets (0.13 s for GSM8K there;
``benchmarks/micro/prompt_tokens.py``). Entries are written to a temporary file and published by rename, so
concurrent runs never read half a file; the newest :data:`KEEP` are kept.

The cache lives in ``$GRPO_CACHE_DIR/prompt_tokens`` (default ``~/.cache/grpo_rl``, as the converted embedded
model); ``GRPO_PROMPT_TOKEN_CACHE=0`` turns it off. The folder is trusted as the model cache beside it is (entries
are read with ``allow_pickle`` off, so a planted file can change prompts, never run code). Data sets under
:data:`MIN_PROMPTS` prompts are tokenized each time.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from grpo_rl.model.loading import cache_dir

log = logging.getLogger(__name__)

MIN_PROMPTS = 512
"""Smaller data sets tokenize in well under a second: not worth a file."""

KEEP = 64
"""Cache entries kept (the newest by modification time); GSM8K's training set is about 9 MB."""

_VERSION = b"prompt-tokens-v1"


def tokenize_prompts(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """The token ids of each of ``texts`` (no special tokens added), from the cache when it holds them."""
    if len(texts) < MIN_PROMPTS or os.environ.get("GRPO_PROMPT_TOKEN_CACHE", "1") == "0":
        return _tokenize(tokenizer, texts)
    key = _key(tokenizer, texts)
    if key is None:
        return _tokenize(tokenizer, texts)
    folder = cache_dir() / "prompt_tokens"
    path = folder / f"{key}.npz"
    cached = _read(path, len(texts))
    if cached is not None:
        return cached
    ids = _tokenize(tokenizer, texts)
    _write(folder, path, ids)
    return ids


def _tokenize(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    # one batched call: a fast tokenizer encodes the list in Rust (the same ids as encode, one text at a time)
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def _key(tokenizer, texts: Sequence[str]) -> str | None:
    """SHA-256 of the tokenizer's full serialisation and the texts; None for a tokenizer that has none."""
    backend = getattr(tokenizer, "backend_tokenizer", None)  # transformers' fast tokenizers; slow ones have none
    if backend is None:
        return None
    h = hashlib.sha256(_VERSION)
    h.update(backend.to_str().encode())
    for text in texts:
        encoded = text.encode()
        h.update(len(encoded).to_bytes(8, "little"))
        h.update(encoded)
    return h.hexdigest()


def _read(path: Path, count: int) -> list[list[int]] | None:
    try:
        with np.load(path) as data:
            flat, offsets = data["ids"], data["offsets"]
    except FileNotFoundError:
        return None
    except Exception as e:  # a damaged entry: tokenize again and replace it
        log.debug("prompt token cache: %s unreadable (%s); tokenizing again", path, e)
        return None
    if len(offsets) != count + 1 or offsets[-1] != len(flat):
        return None
    flat_list = flat.tolist()
    bounds = offsets.tolist()
    os.utime(path)  # recently used: kept by the pruning
    return [flat_list[bounds[i] : bounds[i + 1]] for i in range(count)]


def _write(folder: Path, path: Path, ids: list[list[int]]) -> None:
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in ids], out=offsets[1:])
    flat = np.fromiter((t for row in ids for t in row), dtype=np.int32, count=int(offsets[-1]))
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, ids=flat, offsets=offsets)
        os.replace(tmp, path)  # readers see the whole file or none
        _prune(folder)
    except OSError as e:  # a read-only or full cache folder costs the next run 2 s, not this one its start
        log.debug("prompt token cache: could not write %s (%s)", path, e)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _prune(folder: Path) -> None:
    entries = []
    for entry in folder.glob("*.npz"):
        try:
            entries.append((entry.stat().st_mtime, entry))
        except FileNotFoundError:  # pruned by another run meanwhile
            continue
    for _, old in sorted(entries, reverse=True)[KEEP:]:
        old.unlink(missing_ok=True)
