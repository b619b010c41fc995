"""Loading prompt data sets from the Hugging Face hub or from local files.

Three sources: ``"gsm8k"`` (``openai/gsm8k``, config ``main``), ``"ifeval"``
(``google/IFEval``) and ``"file"`` (a local ``.jsonl``, ``.json`` or ``.parquet``), whose rows may
instead come from any hub data set by name (:func:`load_hub_records`, ``env.hub_dataset``).
For the two named data sets the order is: an explicit ``path``, then the local copies under
:func:`data_dir` (no network wait, the same records every run), then the hub (skipped when
``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set, so offline runs and tests never wait on a
network timeout).
Both give the same records (see ``../shared/data/README.md``); hub IFEval rows are
made to match the local file by dropping the ``None`` values that Arrow adds to
``kwargs`` when it unifies their schemas.

Every error is a :class:`~grpo_rl.errors.DataError` naming the input it came from
(file and line where there is one) and how to fix it, since a bad data path is the
most common way a training run dies before its first step.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pathlib
import socket
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_rl.errors import DataError

log = logging.getLogger(__name__)

__all__ = ["DataError", "DataFileNotFoundError", "data_dir", "load_hub_records", "load_records"]

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
_TRUTHY = {"1", "true", "yes", "on"}
_FIX = "set env.path=<dir or file> or the GRPO_DATA_DIR environment variable"
_UTF8_FIX = "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in.jsonl > out.jsonl`)"


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A data file, or every source of a named data set, is missing."""


@dataclass(frozen=True)
class _NamedDataset:
    """Where one named data set lives on the hub and in a local data directory."""

    hub_path: str
    hub_config: str | None
    local_dir: str
    # split name -> file name inside local_dir (and inside an explicit path dir)
    split_files: dict[str, str]
    # Fields every record must have; checked on load so a wrong file fails here
    # rather than as a KeyError deep inside a reward function.
    fields: tuple[str, ...]


_NAMED = {
    "gsm8k": _NamedDataset(
        hub_path="openai/gsm8k",
        hub_config="main",
        local_dir="gsm8k",
        split_files={"train": "train.jsonl", "test": "test.jsonl"},
        fields=("question", "answer"),
    ),
    "ifeval": _NamedDataset(
        hub_path="google/IFEval",
        hub_config=None,
        local_dir="ifeval",
        split_files={"train": "input_data.jsonl"},
        fields=("key", "prompt", "instruction_id_list", "kwargs"),
    ),
}


def data_dir() -> pathlib.Path | None:
    """The local data directory: ``$GRPO_DATA_DIR`` if set, else ``<repo root>/../shared/data`` if it exists, else
    None."""
    env = os.environ.get("GRPO_DATA_DIR")
    if env:  # even if it does not exist, so that a typo shows up as a missing file naming it
        return pathlib.Path(env).expanduser()
    shared = _REPO_ROOT.parent / "shared" / "data"
    return shared if shared.is_dir() else None


def _hub_offline() -> bool:
    return any(os.environ.get(var, "").strip().lower() in _TRUTHY for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _hub_unreachable(timeout: float = 3.0) -> str | None:
    """The hub's host when a connection to it fails within ``timeout`` seconds, else None (also behind a proxy)."""
    # datasets retries an unreachable hub for about 25 s before its cache; this lets a run go straight to the cache.
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # behind a proxy a direct connection says nothing: datasets decides
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = url.hostname or "huggingface.co"
    try:
        socket.create_connection((host, url.port or (80 if url.scheme == "http" else 443)), timeout=timeout).close()
    except OSError:
        return host
    return None


@contextlib.contextmanager
def _datasets_offline(offline: bool):
    """Make ``datasets`` and ``huggingface_hub`` read only their caches while ``offline``, whatever the environment
    variables were when they were imported (they read them once, at import)."""
    if not offline:
        yield
        return
    import datasets.config
    import huggingface_hub.constants

    saved = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def _first_line(error: BaseException, limit: int = 200) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def load_hub_records(name: str, config: str | None = None, split: str = "train") -> list[dict[str, Any]]:
    """The rows of the Hugging Face data set ``name`` (``env.hub_dataset``), by ``datasets.load_dataset``; offline
    or with the hub unreachable, from the local datasets cache without waiting on the network.

    Raises:
        DataFileNotFoundError: the data set cannot be loaded; one line naming it, why, and the fixes (go online, or
            save it to a local file and pass ``env.path``).
    """
    import datasets  # heavy; only imported when a hub data set is asked for

    where = f"env.hub_dataset={name}" + (f" (env.hub_config={config})" if config else "") + f" split {split!r}"
    save = (
        f"or, where the hub is reachable, save it with datasets.load_dataset({name!r}, {config!r}, "
        f"split={split!r}).to_json('prompts.jsonl') and pass env.path=prompts.jsonl instead of env.hub_dataset"
    )
    if _hub_offline():
        offline = (
            "HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set",
            "set HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 to download it (scripts/env.sh sets both to 1 unless "
            "they are set)",
        )
    else:
        host = _hub_unreachable()
        offline = (f"the hub ({host}) is unreachable", "check the network (and HF_ENDPOINT)") if host else None
    try:
        with _datasets_offline(offline is not None):
            hub = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # missing cache, no network, no such data set, config or split: all end the run here
        if offline is not None:
            raise DataFileNotFoundError(
                f"cannot load {where}: {offline[0]} and the local datasets cache could not "
                f"serve it ({_first_line(e)}); to fix, {offline[1]}, {save}"
            ) from e
        raise DataFileNotFoundError(
            f"cannot load {where} from the hub ({_first_line(e)}); check env.hub_dataset, "
            f"env.hub_config and env.split, {save}"
        ) from e
    records = hub.to_list()
    if not records:
        raise DataError(f"{where} is empty (no rows); choose another env.split or data set")
    log.info(
        "  data:      file: %d records from hub:%s%s[%s]", len(records), name, f"/{config}" if config else "", split
    )
    return records


def _read_bytes(path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise DataError(f"data file {path} cannot be read ({e.strerror or e}); check its permissions") from e


def _decode(raw: bytes, path: pathlib.Path) -> str:
    """The UTF-8 text of a data file (a leading byte-order mark dropped)."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(
            f"{path}:{line}: not valid UTF-8 (byte {raw[e.start : e.start + 1]!r} at column {column}); {_UTF8_FIX}"
        ) from e


def _read_jsonl(path: pathlib.Path, raw: bytes | None = None) -> list[dict[str, Any]]:
    records = []
    text = _decode(_read_bytes(path) if raw is None else raw, path)
    # Universal newlines, as reading the file in text mode splits lines (str.splitlines would
    # also split at characters JSON allows inside strings, such as U+2028).
    for line_number, line in enumerate(io.StringIO(text, newline=None), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path}:{line_number}: malformed JSON line: {e}; fix or remove that line "
                "(each line must be one JSON object)"
            ) from e
        if not isinstance(record, dict):
            raise DataError(f"{path}:{line_number}: expected a JSON object per line, got {type(record).__name__}")
        records.append(record)
    return records


def _read_json(path: pathlib.Path) -> list[dict[str, Any]]:
    raw = _read_bytes(path)
    text = _decode(raw, path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        # Many ".json" files are really JSON Lines; the hub's json loader accepts
        # both, so do the same rather than fail on the second line.
        if e.msg == "Extra data":
            return _read_jsonl(path, raw)
        raise DataError(f"{path}: malformed JSON at line {e.lineno}: {e}; fix the file") from e
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataError(f"{path}: expected a JSON list of objects (or JSON Lines), got {type(data).__name__}")
    return data


def _read_parquet(path: pathlib.Path) -> list[dict[str, Any]]:
    # pyarrow comes with `datasets`; imported here so plain imports stay light.
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several unrelated types for bad files
        raise DataError(
            f"{path}: not a readable parquet file: {e}; rewrite it (pandas: df.to_parquet) or use .jsonl"
        ) from e
    return table.to_pylist()


def _read_file(path: pathlib.Path) -> list[dict[str, Any]]:
    if not path.is_file():
        what = "is a directory, expected a file" if path.is_dir() else "does not exist"
        raise DataFileNotFoundError(f"data file {path} {what}; {_FIX}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        return _read_json(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise DataError(f"data file {path}: unsupported extension {path.suffix!r}; expected one of {list(_FILE_SUFFIXES)}")


def _local_file(dataset: _NamedDataset, root: pathlib.Path, split: str) -> pathlib.Path:
    """Resolves ``root`` (a file, or a directory holding the split file) to a file."""
    if root.is_dir():
        return root / dataset.split_files[split]
    return root


def _load_from_hub(name: str, dataset: _NamedDataset, split: str) -> list[dict[str, Any]]:
    import datasets  # heavy; only imported when the hub is actually tried

    hub = datasets.load_dataset(dataset.hub_path, dataset.hub_config, split=split)
    records = hub.to_list()
    if name == "ifeval":
        for record in records:
            record["kwargs"] = [{k: v for k, v in kwargs.items() if v is not None} for kwargs in record["kwargs"]]
    return records


def _load_named(name: str, split: str, paths: list[str] | None) -> list[tuple[list[dict[str, Any]], str]]:
    """Loads gsm8k/ifeval; returns the records of each source with a description of where from."""
    dataset = _NAMED[name]
    if split not in dataset.split_files:
        raise DataError(f"{name} has no split {split!r}; set env.split to one of {sorted(dataset.split_files)}")
    if paths is not None:
        files = [_local_file(dataset, pathlib.Path(path).expanduser(), split) for path in paths]
        return [(_read_file(file), str(file)) for file in files]

    # A local copy first: no network wait, and the same records on every run.
    local_root = data_dir()
    if local_root is not None:
        file = local_root / dataset.local_dir / dataset.split_files[split]
        if file.is_file():
            return [(_read_file(file), str(file))]
        looked = f"{file} does not exist"
    else:
        looked = "no local data directory (GRPO_DATA_DIR unset and no ../shared/data)"

    if _hub_offline():
        hub_failure = "skipped because HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set"
    else:
        try:
            return [(_load_from_hub(name, dataset, split), f"hub:{dataset.hub_path}[{split}]")]
        except Exception as e:  # no network, no auth, missing cache: all mean "not here"
            hub_failure = f"unreachable ({type(e).__name__}: {e})"
    raise DataFileNotFoundError(
        f"cannot load {name} split {split!r}: the hub {dataset.hub_path} was {hub_failure}, "
        f"and {looked}. To fix, {_FIX} (a directory holding "
        f"{dataset.local_dir}/{dataset.split_files[split]})."
    )


def _check_fields(records: list[dict[str, Any]], required: Sequence[str], where: str) -> None:
    for index, record in enumerate(records):
        for field in required:
            if field not in record:
                raise DataError(
                    f"{where}: row {index} is missing required field {field!r} "
                    f"(fields present: {sorted(record)}); every row needs it: fix the data, "
                    f"or point env.path at the right file"
                )


def _as_paths(path: str | os.PathLike | Sequence[str] | None) -> list[str] | None:
    """``env.path`` as a list of paths: one path, or a list of them (a YAML/Hydra list arrives as a ListConfig)."""
    if path is None:
        return None
    if isinstance(path, (str, os.PathLike)):
        return [path]
    paths = list(path)
    if not paths:
        raise DataError(
            "env.path=[] names no file; set env.path to a file, or a list of files such as env.path=[a.jsonl,b.jsonl]"
        )
    for entry in paths:
        if not isinstance(entry, (str, os.PathLike)) or not str(entry):
            raise DataError(f"env.path={paths}: entry {entry!r} is not a file path; list file paths only")
    return paths


def load_records(
    source: str,
    *,
    split: str = "train",
    path: str | Sequence[str] | None = None,
    required_fields: Sequence[str] = (),
) -> list[dict]:
    """Loads a data set as a list of plain dict records, in file (and list) order.

    Args:
        source: ``"gsm8k"``, ``"ifeval"`` or ``"file"``.
        split: ``"train"`` or ``"test"`` for gsm8k; ``"train"`` (the only split) for ifeval; ignored for ``"file"``.
        path: For gsm8k/ifeval, an optional local override: a file, or a directory holding the split file
            (``train.jsonl``/``test.jsonl`` for gsm8k, ``input_data.jsonl`` for ifeval). For ``"file"``, the
            ``.jsonl``, ``.json`` or ``.parquet`` file to read (required). Either may be a list: the records of
            each are concatenated in order, each checked on its own.
        required_fields: Fields every record must have, beyond the ones the named data sets always need.

    Raises:
        DataFileNotFoundError: a file is missing, or the hub is unreachable and no local copy exists; the message
            says how to point at one (also a ``FileNotFoundError``).
        DataError: an unknown source or split, a file that is not UTF-8 or has a malformed line, a record missing a
            required field, or an empty data set or file (also a ``ValueError``).
    """
    paths = _as_paths(path)
    if source == "file":
        if paths is None:
            raise DataError("data source 'file' needs a path: set env.path=<file>")
        files = [pathlib.Path(p).expanduser() for p in paths]
        parts = [(_read_file(file), str(file)) for file in files]
        required = tuple(required_fields)
    elif source in _NAMED:
        parts = _load_named(source, split, paths)
        required = _NAMED[source].fields + tuple(required_fields)
    else:
        raise DataError(f"unknown data source {source!r}; set env.dataset to one of {[*sorted(_NAMED), 'file']}")
    records: list[dict[str, Any]] = []
    for part, where in parts:
        if not part:
            raise DataError(f"{where}: data set is empty (no records); point env.path at a file with rows")
        _check_fields(part, list(dict.fromkeys(required)), where)
        records.extend(part)
    where = parts[0][1] if len(parts) == 1 else f"{len(parts)} files ({', '.join(w for _, w in parts)})"
    log.info(
        "  data:      %s: %d records from %s", source if source == "file" else f"{source} {split}", len(records), where
    )
    return records
