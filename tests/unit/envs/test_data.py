"""Tests for grpo_rl.envs.data: source order, real shared files, and every error path.

The hub is never contacted: tests run with the offline flags set, and the ones about
hub ordering put a fake ``datasets`` module in ``sys.modules``.
"""

from __future__ import annotations

import json
import pathlib
import sys
import types
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_rl.envs import data
from grpo_rl.envs.data import data_dir, load_records

# Resolved once, before the autouse fixture below clears GRPO_DATA_DIR.
REAL_DATA_DIR = data_dir()
needs_real_data = pytest.mark.skipif(
    REAL_DATA_DIR is None or not (REAL_DATA_DIR / "gsm8k" / "train.jsonl").is_file(),
    reason="shared data sets not found (set GRPO_DATA_DIR or provide ../shared/data)",
)


@pytest.fixture(autouse=True)
def _offline_without_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("GRPO_DATA_DIR", raising=False)
    # A repo root with no ../shared/data next to it, so only what a test sets up exists.
    monkeypatch.setattr(data, "_REPO_ROOT", tmp_path / "no_repo")


def _online(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")


class _FakeHubDataset:
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self._records = records

    def to_list(self) -> list[dict[str, Any]]:
        return self._records


def _fake_datasets(monkeypatch: pytest.MonkeyPatch, result: list[dict[str, Any]] | Exception) -> list[tuple[Any, ...]]:
    """Installs a fake `datasets` module; returns the list its calls are recorded in."""
    calls: list[tuple[Any, ...]] = []

    def load_dataset(path: str, name: str | None = None, *, split: str) -> _FakeHubDataset:
        calls.append((path, name, split))
        if isinstance(result, Exception):
            raise result
        return _FakeHubDataset(result)

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def _write_jsonl(path: pathlib.Path, rows: list[Any]) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


GSM_ROWS = [{"question": "1+1?", "answer": "#### 2"}, {"question": "2+2?", "answer": "#### 4"}]


# data_dir


def test_data_dir_prefers_env(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path / "anywhere"))
    assert data_dir() == tmp_path / "anywhere"


def test_data_dir_shared_next_to_repo(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    assert data_dir() is None
    monkeypatch.setattr(data, "_REPO_ROOT", tmp_path / "main")
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert data_dir() == tmp_path / "shared" / "data"


# Real shared data


@needs_real_data
@pytest.mark.parametrize(("split", "rows"), [("train", 7473), ("test", 1319)])
def test_real_gsm8k(monkeypatch: pytest.MonkeyPatch, split: str, rows: int) -> None:
    monkeypatch.setenv("GRPO_DATA_DIR", str(REAL_DATA_DIR))
    records = load_records("gsm8k", split=split)
    assert len(records) == rows
    assert set(records[0]) == {"question", "answer"}
    assert "####" in records[-1]["answer"]


@needs_real_data
def test_real_gsm8k_explicit_dir_and_file() -> None:
    assert REAL_DATA_DIR is not None
    by_dir = load_records("gsm8k", split="test", path=str(REAL_DATA_DIR / "gsm8k"))
    by_file = load_records("gsm8k", path=str(REAL_DATA_DIR / "gsm8k" / "test.jsonl"))
    assert by_dir == by_file
    assert len(by_dir) == 1319


@needs_real_data
def test_real_ifeval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_DATA_DIR", str(REAL_DATA_DIR))
    records = load_records("ifeval")
    assert len(records) == 541
    assert records[0]["key"] == 1000
    assert len(records[0]["instruction_id_list"]) == len(records[0]["kwargs"])


@needs_real_data
def test_real_file_source_reads_shared_jsonl() -> None:
    assert REAL_DATA_DIR is not None
    path = REAL_DATA_DIR / "ifeval" / "input_data.jsonl"
    assert len(load_records("file", path=str(path), required_fields=["prompt"])) == 541


# Source order: explicit path > data_dir() > hub (unless offline)


def test_hub_used_when_there_is_no_local_copy(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    _online(monkeypatch)
    calls = _fake_datasets(monkeypatch, GSM_ROWS)
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path / "empty"))
    assert load_records("gsm8k", split="test") == GSM_ROWS
    assert calls == [("openai/gsm8k", "main", "test")]


def test_explicit_path_beats_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    _online(monkeypatch)
    calls = _fake_datasets(monkeypatch, RuntimeError("must not be called"))
    _write_jsonl(tmp_path / "train.jsonl", GSM_ROWS)
    assert load_records("gsm8k", path=str(tmp_path)) == GSM_ROWS
    assert calls == []


def test_local_copy_beats_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """A local copy is read without touching the network (an unreachable hub costs ~25 s of retries)."""
    _online(monkeypatch)
    calls = _fake_datasets(monkeypatch, RuntimeError("must not be called"))
    _write_jsonl(tmp_path / "gsm8k" / "train.jsonl", GSM_ROWS)
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path))
    assert load_records("gsm8k") == GSM_ROWS
    assert calls == []


def test_hub_failure_without_local_copy_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    _fake_datasets(monkeypatch, ConnectionError("no route to host"))
    with pytest.raises(FileNotFoundError) as info:
        load_records("gsm8k")
    message = str(info.value)
    assert "openai/gsm8k was unreachable (ConnectionError: no route to host)" in message
    assert "env.path=" in message and "GRPO_DATA_DIR" in message
    assert "gsm8k/train.jsonl" in message


@pytest.mark.parametrize("flag", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_offline_flag_skips_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, flag: str) -> None:
    _online(monkeypatch)
    monkeypatch.setenv(flag, "1")
    calls = _fake_datasets(monkeypatch, RuntimeError("must not be called"))
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        load_records("ifeval")
    assert calls == []
    assert "skipped because HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set" in str(info.value)
    assert str(tmp_path / "ifeval" / "input_data.jsonl") in str(info.value)


def test_hub_ifeval_kwargs_match_local_file(monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    # Arrow fills every kwargs struct with all keys; the original file has only the set ones.
    hub_row = {
        "key": 1,
        "prompt": "p",
        "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
        "kwargs": [
            {"num_words": None, "relation": None},
            {"num_words": 300, "relation": "at least"},
        ],
    }
    calls = _fake_datasets(monkeypatch, [hub_row])
    [record] = load_records("ifeval")
    assert record["kwargs"] == [{}, {"num_words": 300, "relation": "at least"}]
    assert calls == [("google/IFEval", None, "train")]


# Custom files


def test_file_jsonl(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "custom.jsonl"
    path.write_text('{"prompt": "a", "n": 1}\n\n{"prompt": "b", "n": 2}\n', encoding="utf-8")
    assert load_records("file", path=str(path), required_fields=["prompt"]) == [
        {"prompt": "a", "n": 1},
        {"prompt": "b", "n": 2},
    ]


def test_file_parquet(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "custom.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "n": [1, 2]}), path)
    assert load_records("file", path=str(path), required_fields=["prompt", "n"]) == [
        {"prompt": "a", "n": 1},
        {"prompt": "b", "n": 2},
    ]


@pytest.mark.parametrize("text", ['[{"prompt": "a"}, {"prompt": "b"}]', '{"prompt": "a"}\n{"prompt": "b"}\n'])
def test_file_json_list_or_lines(tmp_path: pathlib.Path, text: str) -> None:
    path = tmp_path / "custom.json"
    path.write_text(text, encoding="utf-8")
    assert load_records("file", path=str(path)) == [{"prompt": "a"}, {"prompt": "b"}]


def test_gsm8k_path_may_be_a_file_with_any_name(tmp_path: pathlib.Path) -> None:
    path = _write_jsonl(tmp_path / "mine.jsonl", GSM_ROWS)
    assert load_records("gsm8k", split="test", path=str(path)) == GSM_ROWS


# Errors name the input and the fix


def test_missing_file_names_path(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=f"{path} does not exist"):
        load_records("file", path=str(path))


def test_gsm8k_dir_without_split_file(tmp_path: pathlib.Path) -> None:
    _write_jsonl(tmp_path / "train.jsonl", GSM_ROWS)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "test.jsonl")):
        load_records("gsm8k", split="test", path=str(tmp_path))


def test_file_source_rejects_directory(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match="is a directory, expected a file"):
        load_records("file", path=str(tmp_path))


def test_malformed_jsonl_line_names_file_and_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": oops}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}:3: malformed JSON line"):
        load_records("file", path=str(path))


def test_jsonl_line_not_an_object(tmp_path: pathlib.Path) -> None:
    path = _write_jsonl(tmp_path / "list.jsonl", [{"prompt": "a"}, [1, 2]])
    with pytest.raises(ValueError, match=f"{path}:2: expected a JSON object per line, got list"):
        load_records("file", path=str(path))


@pytest.mark.parametrize(
    ("text", "match"),
    [('{"a": 1', "malformed JSON at line 1"), ('{"a": 1}', "expected a JSON list of objects")],
)
def test_bad_json_file(tmp_path: pathlib.Path, text: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=match) as info:
        load_records("file", path=str(path))
    assert str(path) in str(info.value)


def test_bad_parquet_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.parquet"
    path.write_text("not parquet", encoding="utf-8")
    with pytest.raises(ValueError, match="not a readable parquet file") as info:
        load_records("file", path=str(path))
    assert str(path) in str(info.value)


def test_missing_required_field(tmp_path: pathlib.Path) -> None:
    path = _write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "a"}, {"text": "b", "id": 1}])
    with pytest.raises(ValueError) as info:
        load_records("file", path=str(path), required_fields=["prompt"])
    assert str(info.value) == (
        f"{path}: row 1 is missing required field 'prompt' (fields present: ['id', 'text']); "
        "every row needs it: fix the data, or point env.path at the right file"
    )


def test_named_dataset_checks_its_own_fields(tmp_path: pathlib.Path) -> None:
    _write_jsonl(tmp_path / "train.jsonl", [{"question": "q"}])
    with pytest.raises(ValueError, match="row 0 is missing required field 'answer'"):
        load_records("gsm8k", path=str(tmp_path))


@pytest.mark.parametrize("name", ["empty.jsonl", "blank.jsonl", "empty.json", "empty.parquet"])
def test_empty_dataset(tmp_path: pathlib.Path, name: str) -> None:
    path = tmp_path / name
    if name == "blank.jsonl":
        path.write_text("\n  \n", encoding="utf-8")
    elif name == "empty.json":
        path.write_text("[]", encoding="utf-8")
    elif name == "empty.parquet":
        pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    else:
        path.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}: data set is empty"):
        load_records("file", path=str(path))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"source": "mnist"}, "unknown data source 'mnist'"),
        ({"source": "gsm8k", "split": "validation"}, "gsm8k has no split 'validation'"),
        ({"source": "ifeval", "split": "test"}, "ifeval has no split 'test'"),
        ({"source": "file"}, "needs a path: set env.path="),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_records(**kwargs)


def test_unsupported_extension(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("prompt\na\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"unsupported extension '\.csv'"):
        load_records("file", path=str(path))


# A list of files


def test_file_list_is_concatenated_in_order(tmp_path: pathlib.Path) -> None:
    first = _write_jsonl(tmp_path / "a.jsonl", [{"prompt": "a1"}, {"prompt": "a2"}])
    second = tmp_path / "b.parquet"
    pq.write_table(pa.table({"prompt": ["b1"]}), second)
    assert load_records("file", path=[str(second), str(first)], required_fields=["prompt"]) == [
        {"prompt": "b1"},
        {"prompt": "a1"},
        {"prompt": "a2"},
    ]


def test_gsm8k_path_list_of_files_and_folders(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "gsm"
    _write_jsonl(folder / "train.jsonl", GSM_ROWS[:1])
    extra = _write_jsonl(tmp_path / "more.jsonl", GSM_ROWS[1:])
    assert load_records("gsm8k", path=[str(folder), str(extra)]) == GSM_ROWS


@pytest.mark.parametrize(
    ("second_rows", "match"),
    [
        ([{"text": "x"}], r"b\.jsonl: row 0 is missing required field 'prompt'"),
        ([], r"b\.jsonl: data set is empty"),
    ],
)
def test_each_file_of_a_list_is_checked_under_its_own_name(
    tmp_path: pathlib.Path, second_rows: list, match: str
) -> None:
    first = _write_jsonl(tmp_path / "a.jsonl", [{"prompt": "a"}])
    second = _write_jsonl(tmp_path / "b.jsonl", second_rows)
    with pytest.raises(ValueError, match=match) as info:
        load_records("file", path=[str(first), str(second)], required_fields=["prompt"])
    assert "a.jsonl" not in str(info.value)


def test_file_list_errors(tmp_path: pathlib.Path) -> None:
    first = _write_jsonl(tmp_path / "a.jsonl", [{"prompt": "a"}])
    with pytest.raises(data.DataFileNotFoundError, match=r"missing\.jsonl does not exist"):
        load_records("file", path=[str(first), str(tmp_path / "missing.jsonl")])
    with pytest.raises(ValueError, match=r"env\.path=\[\] names no file"):
        load_records("file", path=[])
