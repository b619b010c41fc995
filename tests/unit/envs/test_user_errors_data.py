"""Bad inputs end in a UserError that names the file or folder and the fix: data files, model folders,
checkpoints on a full disk, and checkpoints of another model."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_rl.envs import data
from grpo_rl.envs.base import PromptTooLongError
from grpo_rl.envs.data import load_records
from grpo_rl.errors import DataError, RunFolderError, UserError
from grpo_rl.model.loading import (
    ModelFileError,
    ModelNotFoundError,
    TokenizerNotFoundError,
    build_tiny_model,
    check_model_folder,
    load_causal_lm,
    load_tokenizer,
)
from grpo_rl.run import atomic_fs
from grpo_rl.run import checkpoint as ckpt
from grpo_rl.run.checkpoint import (
    Checkpointer,
    CheckpointMismatchError,
    DiskFullError,
    export_model_atomic,
    load_model_weights,
    load_trainer_state,
    remove_stale_tmp,
)

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _no_data_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("GRPO_DATA_DIR", raising=False)
    monkeypatch.setattr(data, "_REPO_ROOT", tmp_path / "no_repo")


# Data files


def test_jsonl_with_invalid_utf8_names_file_line_and_fix(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n\n{"prompt": "caf\xe9"}\n')  # latin-1, not UTF-8
    with pytest.raises(DataError) as info:
        load_records("file", path=str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:3: not valid UTF-8")
    assert "save the file as UTF-8" in message
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)


def test_json_with_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "prompts.json"
    path.write_bytes(b'[\n  {"prompt": "a"},\n  {"prompt": "\xff"}\n]\n')
    with pytest.raises(DataError, match=rf"^{path}:3: not valid UTF-8 .*save the file as UTF-8"):
        load_records("file", path=str(path))


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\n{"prompt": "b"}\n')
    assert load_records("file", path=str(path)) == [{"prompt": "a"}, {"prompt": "b"}]


def test_malformed_jsonl_line_is_a_data_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": oops}\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{path}:2: malformed JSON line.*fix or remove that line"):
        load_records("file", path=str(path))


def test_missing_field_names_file_and_field(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text('{"question": "q"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{path}: row 0 is missing required field 'answer'"):
        load_records("gsm8k", path=str(path))


def test_missing_file_is_a_data_error_with_the_fix(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(DataError) as info:
        load_records("file", path=str(path))
    assert isinstance(info.value, FileNotFoundError)  # callers catching the old type still do
    assert str(path) in str(info.value) and "env.path" in str(info.value) and "GRPO_DATA_DIR" in str(info.value)


def test_named_dataset_nowhere_is_a_data_error():
    with pytest.raises(DataError, match="env.path=.*GRPO_DATA_DIR"):
        load_records("gsm8k")


def test_too_long_prompt_is_a_data_error():
    assert issubclass(PromptTooLongError, DataError)


# Model folders


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))


def _truncate(file: Path, size: int) -> None:
    with open(file, "r+b") as f:
        f.truncate(size)


@pytest.mark.parametrize("keep", ["half", 4])
def test_truncated_weights_name_the_file_and_the_fix(model_copy, keep):
    weights = model_copy / "model.safetensors"
    _truncate(weights, weights.stat().st_size // 2 if keep == "half" else keep)
    with pytest.raises(ModelFileError) as info:
        load_causal_lm(str(model_copy), CPU)
    message = str(info.value)
    assert isinstance(info.value, UserError)
    assert message.startswith(f"{weights} is ")
    assert "download or convert the model again" in message


def test_truncated_embedded_copy_says_to_delete_the_cache_folder(model_copy, tmp_path):
    folder = model_copy.rename(tmp_path / "smollm2-135m-instruct")  # the embedded model's cache folder name
    _truncate(folder / "model.safetensors", 1000)
    with pytest.raises(ModelFileError, match=rf"delete the folder {folder} and the next run converts it again"):
        load_causal_lm(str(folder), CPU)


def test_broken_tokenizer_file_is_named(model_copy):
    tokenizer_json = model_copy / "tokenizer.json"
    text = tokenizer_json.read_text(encoding="utf-8")
    tokenizer_json.write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(ModelFileError, match=rf"^{tokenizer_json} is not valid JSON"):
        load_tokenizer(str(model_copy))


@pytest.mark.parametrize("keep_config", [False, True])
def test_a_folder_without_tokenizer_files_names_the_missing_files(model_copy, keep_config):
    removed = ["tokenizer.json", "chat_template.jinja"] + ([] if keep_config else ["tokenizer_config.json"])
    for name in removed:
        (model_copy / name).unlink()
    missing = "tokenizer.json is missing" if keep_config else "tokenizer.json and tokenizer_config.json are missing"
    expected = (
        f"model.name={model_copy}: the folder holds no tokenizer: {missing}, and so is every vocabulary "
        "file a tokenizer can be built from (tokenizer.model, vocab.json with merges.txt, vocab.txt, "
        "*.tiktoken). Copy the tokenizer files of the model these weights come from into that folder "
        f"(AutoTokenizer.from_pretrained(<that model>).save_pretrained('{model_copy}') writes them)"
    )
    with pytest.raises(TokenizerNotFoundError) as info:
        check_model_folder(str(model_copy))  # with the other model-folder checks, before any engine
    assert isinstance(info.value, UserError) and str(info.value) == expected
    with pytest.raises(TokenizerNotFoundError, match=rf"^{model_copy} holds no tokenizer: {missing}"):
        load_tokenizer(str(model_copy))  # and where a tokenizer is loaded without that check


def test_a_folder_with_a_vocabulary_but_no_tokenizer_json_passes(model_copy, tokenizer):
    (model_copy / "tokenizer.json").unlink()
    tokenizer.backend_tokenizer.model.save(str(model_copy))  # vocab.json and merges.txt
    assert (model_copy / "vocab.json").is_file()
    check_model_folder(str(model_copy))


def test_model_not_found_is_a_user_error():
    assert issubclass(ModelNotFoundError, UserError) and issubclass(ModelNotFoundError, FileNotFoundError)


# Checkpoints on a full disk


def _save(ckp: Checkpointer, step: int, model, tokenizer) -> Path:
    return ckp.save(step, model, tokenizer, {"learner": {"version": step}}, config_yaml="model:\n  name: tiny\n")


@pytest.mark.parametrize("code, says", [(errno.ENOSPC, "the disk is full"), (errno.EDQUOT, "disk quota")])
def test_full_disk_during_save(tiny_model, tokenizer, tmp_path, monkeypatch, code, says):
    ckp = Checkpointer(tmp_path, keep=2)
    first = _save(ckp, 1, tiny_model, tokenizer)

    def full(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"partial")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(ckpt.torch, "save", full)
    with pytest.raises(DiskFullError) as info:
        _save(ckp, 2, tiny_model, tokenizer)
    message = str(info.value)
    assert isinstance(info.value, UserError) and info.value.errno == code
    assert f"cannot write checkpoint {ckp.root / 'step_00000002'}" in message
    assert says in message and "set output_dir to a folder on another disk" in message
    assert sorted(p.name for p in ckp.root.iterdir()) == ["step_00000001"]  # no .tmp-* left
    assert ckp.latest() == first and load_trainer_state(first)["step"] == 1


def test_full_disk_reported_by_safetensors(tiny_model, tokenizer, tmp_path, monkeypatch):
    """safetensors hides the errno in its message; the words are enough."""
    ckp = Checkpointer(tmp_path, keep=2)

    def full(self, *args, **kwargs):
        raise RuntimeError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )

    monkeypatch.setattr(type(tiny_model), "save_pretrained", full)
    with pytest.raises(DiskFullError, match="the disk is full"):
        _save(ckp, 1, tiny_model, tokenizer)
    assert list(ckp.root.iterdir()) == []


def test_other_save_errors_are_not_called_a_full_disk(tiny_model, tokenizer, tmp_path, monkeypatch):
    def broken(obj, path, *args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ckpt.torch, "save", broken)
    with pytest.raises(OSError, match="Input/output error") as info:
        _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    assert not isinstance(info.value, DiskFullError)


def test_full_disk_during_export_keeps_the_old_export(tiny_model, tokenizer, tmp_path, monkeypatch):
    out = export_model_atomic(tiny_model, tokenizer, tmp_path / "final_model")
    before = (out / "model.safetensors").read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tokenizer, "save_pretrained", full)
    with pytest.raises(DiskFullError, match=rf"cannot write the model export {out}: the disk is full"):
        export_model_atomic(tiny_model, tokenizer, out)
    assert (out / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model"]


# Leftover temporary folders


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_checkpointer_removes_leftover_tmp_folders(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    host = atomic_fs._host()
    dead = root / f".tmp-step_00000003-{_dead_pid()}@{host}-abcd1234"
    legacy = root / ".tmp-step_00000002-xyz"  # the naming before writers were recorded
    live = root / f".tmp-step_00000004-{os.getppid()}@{host}-efgh5678"  # another live process, still writing
    for folder in (dead, legacy, live):
        (folder / "model").mkdir(parents=True)
        (folder / "trainer_state.pt").write_bytes(b"partial")
    (root / "step_00000001").mkdir()
    (root / "step_00000001" / "trainer_state.pt").write_bytes(b"kept")

    with caplog.at_level(logging.INFO, logger="grpo_rl.run.checkpoint"):
        Checkpointer(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == sorted(["step_00000001", live.name])
    assert "removed 2 unfinished checkpoint folder(s)" in caplog.text


def test_remove_stale_tmp_on_a_missing_folder(tmp_path):
    assert remove_stale_tmp(tmp_path / "absent") == 0
    assert not (tmp_path / "absent").exists()


def test_tmp_folders_name_their_writer(tiny_model, tokenizer, tmp_path, monkeypatch):
    seen = []
    real_publish = atomic_fs.publish

    def spy(tmp, final):
        seen.append(tmp.name)
        real_publish(tmp, final)

    monkeypatch.setattr(atomic_fs, "publish", spy)
    _save(Checkpointer(tmp_path), 1, tiny_model, tokenizer)
    assert seen and seen[0].startswith(f".tmp-step_00000001-{os.getpid()}@{atomic_fs._host()}-")


# Resuming with another model


def test_checkpoint_of_another_model_is_a_run_folder_error(tiny_model_dir, tokenizer_dir, tokenizer, tmp_path):
    wide_dir = build_tiny_model(str(tokenizer_dir), tmp_path / "wide", hidden_size=128, num_heads=4)
    wide = load_causal_lm(str(wide_dir), CPU)
    path = Checkpointer(tmp_path / "run").save(3, wide, tokenizer, {}, config_yaml=f"model:\n  name: {wide_dir}\n")

    narrow = load_causal_lm(str(tiny_model_dir), CPU)
    before = {k: v.clone() for k, v in narrow.state_dict().items()}
    with pytest.raises(RunFolderError) as info:
        load_model_weights(path, narrow)
    message = str(info.value)
    assert isinstance(info.value, CheckpointMismatchError)
    assert message.startswith(f"{path} was trained with model.name={wide_dir}")
    assert "shape" in message and f"Resume it with model.name={wide_dir}" in message
    assert "set output_dir to another folder to start a fresh run" in message
    assert all(torch.equal(v, before[k]) for k, v in narrow.state_dict().items())  # left untouched


def test_checkpoint_without_config_still_explains(tiny_model_dir, tokenizer_dir, tokenizer, tmp_path):
    wide = load_causal_lm(
        str(build_tiny_model(str(tokenizer_dir), tmp_path / "wide", hidden_size=128, num_heads=4)), CPU
    )
    path = Checkpointer(tmp_path / "run").save(1, wide, tokenizer, {})
    with pytest.raises(CheckpointMismatchError, match="was trained with another model.*the model.name it was"):
        load_model_weights(path, load_causal_lm(str(tiny_model_dir), CPU))
