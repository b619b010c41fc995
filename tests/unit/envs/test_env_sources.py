"""Where a task's prompts come from: ``env.path`` as a list of files, a hub data set (``env.hub_dataset``), enough
prompts for a step, and the run's length in passes over them (``train.prompt_epochs``)."""

from __future__ import annotations

import contextlib
import logging
import socket
from types import SimpleNamespace

import pytest

from grpo_rl.envs import data, make_env
from grpo_rl.errors import ConfigError, DataError
from grpo_rl.run.preflight import validate
from tests.unit.helpers import ROOT, compose_config, write_jsonl

REWARD = ROOT / "examples" / "custom_reward.py"


def _file_cfg(path_override: str, *extra: str):
    cfg = compose_config(
        [
            "env.dataset=file",
            path_override,
            f"reward.path={REWARD}",
            "reward.name=contains_answer",
            "env.shuffle=false",
            *extra,
        ]
    )
    validate(cfg)
    return cfg


def _rows(prefix: str, n: int) -> list[dict]:
    return [{"prompt": f"Say {prefix}{i}.", "ground_truth": f"{prefix}{i}"} for i in range(n)]


def test_path_list_concatenates_files_in_order(tmp_path, tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", _rows("a", 2))
    b = write_jsonl(tmp_path / "b.jsonl", _rows("b", 1))
    env = make_env(_file_cfg(f"env.path=[{b},{a}]", "env.prompts_per_step=3"), tokenizer)
    assert len(env) == 3 and env.name == f"file:{b},{a}"
    assert list(env.reset()["reference"]) == ["b0", "a0", "a1"]


def test_row_errors_name_the_file_of_a_list(tmp_path, tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", _rows("a", 2))
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "", "ground_truth": "x"}])
    with pytest.raises(ValueError, match=rf"env\.path={b}: row 0 column 'prompt' is ''"):
        make_env(_file_cfg(f"env.path=[{a},{b}]", "env.prompts_per_step=1"), tokenizer)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("env.path=[]", r"env\.dataset=file needs env\.path"),
        ("env.path=[a.jsonl,'']", r"'' is not a file path"),
        ("env.path=[a.jsonl,[b.jsonl]]", r"\['b.jsonl'\] is not a file path"),
        ("env.path={a: b}", r"must be a file or folder path, or a list of files"),
    ],
)
def test_bad_path_values(override, match):
    with pytest.raises(ConfigError, match=match):
        _file_cfg(override)


def test_more_prompts_per_step_than_prompts_is_an_error(tmp_path, tokenizer):
    data = write_jsonl(tmp_path / "a.jsonl", _rows("a", 3))
    with pytest.raises(ConfigError) as info:
        make_env(_file_cfg(f"env.path={data}", "env.prompts_per_step=5"), tokenizer)
    message = str(info.value)
    assert "env.prompts_per_step=5 is more than the 3 prompts" in message
    assert "set env.prompts_per_step to at most 3" in message
    env = make_env(_file_cfg(f"env.path={data}", "env.prompts_per_step=3"), tokenizer)
    assert sorted(env.reset()["reference"]) == ["a0", "a1", "a2"]  # exactly as many is fine: no repeats


def test_skipped_prompts_are_counted_in_the_message(tmp_path, tokenizer):
    rows = _rows("a", 2) + [{"prompt": "word " * 400, "ground_truth": "x"}]
    data = write_jsonl(tmp_path / "a.jsonl", rows)
    with pytest.raises(
        ConfigError,
        match=r"more than the 2 prompts in .*\(1 more were skipped as longer than "
        r"env\.max_prompt_tokens=320\)",
    ):
        make_env(_file_cfg(f"env.path={data}", "env.prompts_per_step=3"), tokenizer)


def test_held_out_prompts_may_be_fewer(tmp_path, tokenizer):
    """Evaluation asks for eval.num_prompts and serves each of a smaller split once."""
    data = write_jsonl(tmp_path / "a.jsonl", _rows("a", 3))
    env = make_env(_file_cfg(f"env.path={data}", "env.prompts_per_step=8"), tokenizer, fewer_prompts_ok=True)
    assert env.prompts_per_step == 3 and list(env.reset()["reference"]) == ["a0", "a1", "a2"]


@pytest.mark.parametrize(("epochs", "steps"), [("2", 20), ("0.1", 1), ("1.05", 11)])
def test_prompt_epochs_set_the_steps_from_the_prompts_left_after_loading(tmp_path, tokenizer, caplog, epochs, steps):
    from grpo_rl.run.setup import build_train_env

    rows = _rows("a", 30) + [{"prompt": "word " * 400, "ground_truth": "x"}]  # 31 rows, one skipped as too long
    cfg = _file_cfg(
        f"env.path={write_jsonl(tmp_path / 'a.jsonl', rows)}",
        "env.prompts_per_step=3",
        f"train.prompt_epochs={epochs}",
        "train.steps=7",
    )
    with caplog.at_level(logging.INFO, logger="grpo_rl.run.setup"):
        env = build_train_env(cfg, tokenizer)  # as make_run builds it, before the config is final
    assert len(env) == 30 and cfg.train.steps == steps  # ceil(epochs * 30 / 3); 0.1 is one step, not two
    assert f"train.steps = {steps} (train.prompt_epochs={float(epochs):g} over 30 prompts, 3 per step)" in caplog.text


def test_without_prompt_epochs_the_steps_stay(tmp_path, tokenizer):
    from grpo_rl.run.setup import build_train_env, make_train_env

    cfg = _file_cfg(
        f"env.path={write_jsonl(tmp_path / 'a.jsonl', _rows('a', 4))}", "env.prompts_per_step=2", "train.steps=7"
    )
    build_train_env(cfg, tokenizer)
    assert cfg.train.steps == 7
    env = make_train_env(SimpleNamespace(cfg=cfg, tokenizer=tokenizer, devices=None, rewards=(), train_env=None))
    assert len(env) == 4 and cfg.train.steps == 7


HUB_ROWS = [{"question": f"Say b{i}.", "answer": f"b{i}", "level": i} for i in range(3)]
HUB_COLUMNS = ("env.prompt_column=question", "env.ground_truth_column=answer", "env.prompts_per_step=3")


@pytest.fixture
def hub_calls(monkeypatch):
    """``datasets.load_dataset`` replaced by one that serves HUB_ROWS; the calls it got, with whether the hub was
    off for them."""
    datasets = pytest.importorskip("datasets")
    calls = []

    def load_dataset(name, config=None, split=None, **kwargs):
        calls.append((name, config, split, datasets.config.HF_HUB_OFFLINE))
        return datasets.Dataset.from_list(HUB_ROWS)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_a_hub_dataset_gives_the_prompts_of_the_same_rows_in_a_local_file(tmp_path, tokenizer, hub_calls):
    hub = make_env(
        _file_cfg("env.hub_dataset=org/tasks", "env.hub_config=easy", "env.split=test", *HUB_COLUMNS), tokenizer
    )
    # offline (as every test runs) the cache is still asked, with the hub switched off for the call
    assert hub_calls == [("org/tasks", "easy", "test", True)]
    local = make_env(_file_cfg(f"env.path={write_jsonl(tmp_path / 'rows.jsonl', HUB_ROWS)}", *HUB_COLUMNS), tokenizer)
    assert hub.name == "hub:org/tasks" and len(hub) == len(local) == 3
    a, b = hub.reset(), local.reset()
    for key in ("prompt", "prompt_tokens", "reference", "extra"):
        assert list(a[key]) == list(b[key]), key
    assert list(a["reference"]) == ["b0", "b1", "b2"] and a["extra"][2]["level"] == 2


def test_hub_rows_are_checked_as_a_files_rows(tokenizer, hub_calls):
    with pytest.raises(
        ConfigError,
        match=r"env\.hub_dataset=org/tasks: row 0 has no column env\.prompt_column="
        r"'prompt' \(columns: \['answer', 'level', 'question'\]\)",
    ):
        make_env(_file_cfg("env.hub_dataset=org/tasks", "env.ground_truth_column=answer"), tokenizer)


def test_eval_split_reads_that_split_of_the_hub_dataset(tokenizer, hub_calls):
    make_env(_file_cfg("env.hub_dataset=org/tasks", *HUB_COLUMNS), tokenizer, split="validation")
    assert hub_calls[-1][:3] == ("org/tasks", None, "validation")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (("env.hub_dataset=org/tasks", "env.path=a.jsonl"), r"env\.hub_dataset=org/tasks and env\.path=a\.jsonl both"),
        (("env.hub_config=main",), r"env\.hub_config=main names a configuration of env\.hub_dataset, which is not set"),
    ],
)
def test_hub_dataset_settings_that_contradict(overrides, match):
    with pytest.raises(ConfigError, match=match):
        _file_cfg(*overrides)


def test_hub_dataset_is_for_the_file_task():
    with pytest.raises(ConfigError, match=r"env\.hub_dataset=org/tasks is read with env\.dataset=file"):
        validate(compose_config(["env.hub_dataset=org/tasks"]))


def test_an_uncached_hub_dataset_offline_fails_at_once_in_one_line(tokenizer):
    """HF_HUB_OFFLINE is set (as in every test): the local cache is tried, not the network; the data are loaded
    when the environment is built, which the scripts do before any engine or Ray starts."""
    cfg = _file_cfg("env.hub_dataset=grpo-rl-tests/not-cached", "env.hub_config=main")  # validation loads nothing
    with no_network() as tried, pytest.raises(DataError) as info:
        make_env(cfg, tokenizer)
    message = str(info.value)
    assert tried == []  # the network path retries for about 25 s: it was never taken
    assert "\n" not in message
    for fragment in (
        "env.hub_dataset=grpo-rl-tests/not-cached (env.hub_config=main) split 'train'",
        "HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set",
        "HF_HUB_OFFLINE=0",
        "pass env.path=prompts.jsonl instead of env.hub_dataset",
    ):
        assert fragment in message


def test_an_unreachable_hub_reads_only_the_cache(tokenizer, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.setattr(data, "_hub_unreachable", lambda timeout=3.0: "hub.invalid")
    with (
        no_network() as tried,
        pytest.raises(
            DataError,
            match=r"the hub \(hub\.invalid\) is unreachable and the "
            r"local datasets cache",
        ),
    ):
        make_env(_file_cfg("env.hub_dataset=grpo-rl-tests/not-cached"), tokenizer)
    assert tried == []


@contextlib.contextmanager
def no_network():
    """Every name look-up and connection this process tries (but to loopback and Unix sockets) is refused and
    recorded."""
    tried: list = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def outside(address) -> bool:
        return isinstance(address, tuple) and not str(address[0]).startswith(("127.", "::1", "localhost"))

    def connect(sock, address):
        if outside(address):
            tried.append(address)
            raise OSError("no network in this test")
        return real_connect(sock, address)

    def connect_ex(sock, address):
        if outside(address):
            tried.append(address)
            return 111
        return real_connect_ex(sock, address)

    def getaddrinfo(host, *args, **kwargs):  # a name is looked up before any connection
        if outside((host,)):
            tried.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "no network in this test")
        return real_getaddrinfo(host, *args, **kwargs)

    real_getaddrinfo = socket.getaddrinfo
    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
    try:
        yield tried
    finally:
        socket.socket.connect, socket.socket.connect_ex = real_connect, real_connect_ex
        socket.getaddrinfo = real_getaddrinfo
