"""The served engine without vLLM: its client against a stand-in server, the key middleware, where servers go,
and how a server process is set up. The real servers are in tests/integration/test_served_engine.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.engines.base import SamplingSpec
from grpo_rl.engines.served import ServedEngine
from grpo_rl.engines.server import ServerSpec, server_env
from grpo_rl.engines.vllm_plugin import KEY_ENV, RequireKey
from grpo_rl.errors import RoleFailed
from grpo_rl.placement.context import engine_is_served, plan_placement
from grpo_rl.placement.devices import DeviceAllocation
from grpo_rl.rollout.collector import oldest_token_version
from tests.engine_stand_in import StandIn


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


def test_generation_keeps_the_layout_and_each_tokens_version(stand_in):
    engine = ServedEngine([stand_in.url], key="k", pad_id=0, timeout=10)
    batch = engine.generate([[10, 11], [20]], 2, SamplingSpec(max_new_tokens=4, seed=5))
    assert batch["response_ids"].tolist() == [[10, 0], [11, 12], [20, 0], [21, 22]]
    assert batch["behavior_logprobs"].tolist() == [[-0.5, 0], [-0.5, -1.5], [-0.5, 0], [-0.5, -1.5]]
    assert batch["truncated"].tolist() == [False, True, False, True]
    assert batch["behavior_version"].tolist() == [[7, 0], [3, 7], [7, 0], [3, 7]]
    # each prompt's request carries its own seed (seed + i * n, as in-process) and the token ids
    sent = [body for path, body in stand_in.calls if path == "/inference/v1/generate"]
    assert sorted((b["token_ids"], b["sampling_params"]["seed"]) for b in sent) == [([10, 11], 5), ([20], 7)]
    # a group's age is its oldest token's
    assert oldest_token_version(batch, default=9).tolist() == [7, 3, 7, 3]
    engine.shutdown()


def test_oldest_token_version_without_versions_or_tokens():
    from tensordict import TensorDict

    plain = TensorDict({"response_mask": torch.ones(2, 3)}, batch_size=[2])
    assert oldest_token_version(plain, 4).tolist() == [4, 4]
    mixed = TensorDict(
        {
            "response_mask": torch.tensor([[1, 1, 0], [0, 0, 0]]),
            "behavior_version": torch.tensor([[5, 6, 0], [0, 0, 0]]),
        },
        batch_size=[2],
    )
    assert oldest_token_version(mixed, 4).tolist() == [5, 4]  # padding does not count; an empty answer: default


def test_a_push_is_paused_loaded_versioned_and_read_back(stand_in, tmp_path):
    engine = ServedEngine([stand_in.url], key="k", pad_id=0, timeout=10, weight_dir=str(tmp_path))
    tied, bias = torch.randn(4, 2), torch.randn(3)
    engine.update_weights([("model.embed_tokens.weight", tied), ("lm_head.weight", tied), ("b", bias)], 2)
    paths = [p for p, _ in stand_in.calls]
    push = paths[paths.index("/pause") :]
    assert push == [
        "/pause",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/reset_prefix_cache",
        "/resume",
        "/weight_info",
    ]
    # nothing is in flight between two batches: the server finishes what it has before the weights change
    assert [q for p, q in stand_in.queries if p == "/pause"] == [{"mode": "wait"}]
    update = next(body for p, body in stand_in.calls if p == "/update_weights")["update_info"]
    assert update["num_tensors"] == 2 and update["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
    assert Path(stand_in.weight_dir).parent == tmp_path  # the engine's private folder inside weight_dir
    # what the server read from the file is the learner's tensors, the tied one under both names
    assert sorted(stand_in.weights) == ["b", "lm_head.weight", "model.embed_tokens.weight"]
    assert torch.equal(stand_in.weights["model.embed_tokens.weight"], tied)
    assert torch.equal(stand_in.weights["lm_head.weight"], tied) and torch.equal(stand_in.weights["b"], bias)
    assert not (Path(stand_in.weight_dir) / update["file"]).exists()  # removed once every server loaded it
    assert engine.version == 2 and stand_in.version == "2"
    engine.shutdown()


def test_an_inflight_push_keeps_the_requests_and_casts_to_the_servers_dtype(stand_in, tmp_path):
    engine = ServedEngine(
        [stand_in.url], key="k", pad_id=0, timeout=10, weight_dir=str(tmp_path), inflight=True, dtype="bfloat16"
    )
    weight = torch.randn(5, 3)
    engine.update_weights([("w", weight)], 1)
    # in flight: requests freeze and go on after /resume, instead of being waited for
    assert [q for p, q in stand_in.queries if p == "/pause"] == [{"mode": "keep"}]
    assert stand_in.weights["w"].dtype == torch.bfloat16
    assert torch.equal(stand_in.weights["w"], weight.to(torch.bfloat16))
    engine.update_weights([("w", 2 * weight)], 2)  # a second push: the server reads the new file
    assert [q for p, q in stand_in.queries if p == "/pause"] == [{"mode": "keep"}, {"mode": "keep"}]
    assert torch.equal(stand_in.weights["w"], (2 * weight).to(torch.bfloat16)) and stand_in.version == "2"
    engine.shutdown()


def test_a_server_not_told_the_weight_folder_refuses_the_update(tmp_path):
    """The stand-in reads the file it is sent, as vLLM does: an update before /init_weight_transfer_engine fails."""
    from tests.engine_stand_in import RefusedRequest

    server = StandIn()
    with pytest.raises(RefusedRequest, match="not initialised"):
        server.read_weights({"file": "weights_v1.safetensors", "num_tensors": 1})
    server.close()


def test_a_server_that_dropped_the_update_is_named():
    server = StandIn(takes_updates=False)
    engine = ServedEngine([server.url], key="k", pad_id=0, timeout=10)
    with pytest.raises(
        RoleFailed,
        match=rf"engine server {server.url} reports weight version 0 after the push "
        r"of version 1: the update did not land",
    ):
        engine.update_weights([("w", torch.ones(2))], 1)
    engine.shutdown()
    server.close()


def test_failures_name_the_server_in_one_line():
    slow = StandIn(delay=2.0)
    engine = ServedEngine([slow.url], key="k", pad_id=0, timeout=0.5)
    with pytest.raises(
        RoleFailed,
        match=rf"engine server {slow.url} did not answer /inference/v1/generate within "
        r"inference_model.request_timeout_s=0.5",
    ):
        engine.generate([[1]], 1, SamplingSpec(max_new_tokens=2))
    slow.close()
    other = StandIn(key="other")
    with pytest.raises(RoleFailed, match=rf"engine server {other.url} was started with another key than the run's"):
        ServedEngine([other.url], key="k", pad_id=0, timeout=5)
    assert other.keyed and not any(keyed for _, keyed in other.keyed)  # the key was never sent to it
    other.close()
    gone = StandIn()
    gone.close()
    with pytest.raises(RoleFailed, match=rf"engine server {gone.url} is not reachable"):
        ServedEngine([gone.url], key="k", pad_id=0, timeout=5)


def test_the_key_middleware_guards_every_path(monkeypatch):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(RuntimeError, match=KEY_ENV):
        RequireKey(app)
    monkeypatch.setenv(KEY_ENV, "s3cret")
    guarded = RequireKey(app)

    def status(path: str, auth: str | None) -> int:
        sent = []

        async def send(message):
            sent.append(message)

        headers = [(b"authorization", auth.encode())] if auth else []
        asyncio.run(guarded({"type": "http", "path": path, "method": "POST", "headers": headers}, None, send))
        return sent[0]["status"]

    for path in ("/health", "/pause", "/update_weights", "/collective_rpc", "/inference/v1/generate"):
        assert status(path, None) == 401
        assert status(path, "Bearer wrong") == 401
        assert status(path, "Bearer s3cret") == 200


def _cfg(**overrides):
    return OmegaConf.merge(
        OmegaConf.structured(GRPOConfig), OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()])
    )


def _devices(train: str, inference: str) -> DeviceAllocation:
    return DeviceAllocation(
        train=(torch.device(train),), ref=(torch.device(train),), inference=(torch.device(inference),), reward_model=()
    )


def test_an_engine_off_the_learners_device_is_served_in_the_synchronous_loop():
    cfg = _cfg()
    assert not engine_is_served(cfg, _devices("cpu", "cpu"), "sync")  # the CPU box: in-process
    assert not engine_is_served(cfg, _devices("cuda:0", "cuda:0"), "sync")  # one GPU, shared: in-process
    assert engine_is_served(cfg, _devices("cuda:0", "cuda:1"), "sync")  # a GPU of its own: a server
    assert engine_is_served(cfg, _devices("cuda:1", "cuda:1"), "sync")  # in-process would use cuda:0
    assert not engine_is_served(cfg, _devices("cuda:0", "cuda:1"), "async")  # a Ray actor sees its own GPU
    assert engine_is_served(_cfg(**{"inference_model.engine": "vllm_server"}), _devices("cpu", "cpu"), "async")
    assert not engine_is_served(
        _cfg(**{"inference_model.engine": "transformers"}), _devices("cuda:0", "cuda:1"), "sync"
    )
    placement = plan_placement(cfg, _devices("cuda:0", "cuda:1"), "sync", cores=4)
    assert placement.served and placement.learner.devices == (torch.device("cuda", 0),)
    assert "1 vLLM server" in placement.describe() and "cuda:1" in placement.describe()


def test_each_server_sees_only_its_own_device_and_the_driver_is_untouched(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    before = dict(os.environ)
    gpu = server_env(ServerSpec("m", torch.device("cuda", 2)), key="k")
    assert gpu["CUDA_VISIBLE_DEVICES"] == "2" and gpu[KEY_ENV] == "k" and gpu["VLLM_SERVER_DEV_MODE"] == "1"
    cpu = server_env(ServerSpec("m", torch.device("cpu"), threads=2, cores=(2, 3)), key="k")
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["OMP_NUM_THREADS"] == "2"
    assert cpu["VLLM_CPU_OMP_THREADS_BIND"] == "2,3"
    assert dict(os.environ) == before  # the learner's process still sees every GPU, its cuda:0 is its own


def test_serve_refuses_to_start_without_a_key_and_adds_what_training_needs(monkeypatch):
    from grpo_rl.cli.serve import main, vllm_argv

    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(SystemExit, match=KEY_ENV):
        main(["--model", "m"])
    argv = vllm_argv(["--model", "m"])
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # loopback unless asked otherwise
    assert "grpo_rl.engines.vllm_plugin.RequireKey" in argv and "processed_logprobs" in argv
    assert '{"backend": "grpo_rl_file"}' in argv
    mine = vllm_argv(["--model", "m", "--host", "0.0.0.0", "--weight-transfer-config", '{"backend": "nccl"}'])
    assert mine.count("--host") == 1 and '{"backend": "grpo_rl_file"}' not in mine


def test_served_engine_settings_are_checked_before_anything_starts(monkeypatch):
    from grpo_rl.config.checks import check_values
    from grpo_rl.errors import ConfigError
    from grpo_rl.run.preflight import check_engine

    with pytest.raises(ConfigError, match="set inference_model.engine=vllm_server"):
        check_values(_cfg(**{"inference_model.urls": "[http://10.0.0.5:8000]"}))
    with pytest.raises(ConfigError, match="is not a server address"):
        check_values(_cfg(**{"inference_model.engine": "vllm_server", "inference_model.urls": "[10.0.0.5:8000]"}))
    with pytest.raises(ConfigError, match="pipeline.inflight_updates=true .* inference_model.engine=vllm_server"):
        check_values(_cfg(**{"pipeline.inflight_updates": True}))
    with pytest.raises(ConfigError, match="inference_model.weight_transfer"):
        check_values(_cfg(**{"inference_model.weight_transfer": "carrier_pigeon"}))
    served = {"inference_model.engine": "vllm_server", "inference_model.urls": "[http://10.0.0.5:8000]"}
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=f"set {KEY_ENV}"):
        check_engine(_cfg(**served), _devices("cpu", "cpu"))
    monkeypatch.setenv(KEY_ENV, "k")
    with pytest.raises(ConfigError, match=f"{KEY_ENV} has 1 characters; the servers' key needs at least 32"):
        check_engine(_cfg(**served), _devices("cpu", "cpu"))
    monkeypatch.setenv(KEY_ENV, "k" * 32)
    check_engine(_cfg(**served), _devices("cpu", "cpu"))
    with pytest.raises(ConfigError, match="weight_transfer=nccl sends weights GPU to GPU"):
        check_engine(_cfg(**served, **{"inference_model.weight_transfer": "nccl"}), _devices("cpu", "cpu"))
    with pytest.raises(ConfigError, match="the collectors relay the weights"):
        check_engine(
            _cfg(**served, **{"inference_model.weight_transfer": "nccl"}), _devices("cuda:0", "cuda:1"), "async"
        )


def test_nccl_joins_the_learner_and_one_server_only(monkeypatch):
    from types import SimpleNamespace

    from grpo_rl.engines.build import weight_transfer
    from grpo_rl.errors import ConfigError
    from grpo_rl.run.preflight import check_engine

    def run(inference: tuple[str, ...], mode: str = "sync", **overrides):
        devices = DeviceAllocation(
            train=(torch.device("cuda:0"),),
            ref=(torch.device("cuda:0"),),
            inference=tuple(torch.device(d) for d in inference),
            reward_model=(),
        )
        return SimpleNamespace(cfg=_cfg(**overrides), devices=devices, mode=mode)

    assert weight_transfer(run(("cuda:1",))) == "nccl"
    assert weight_transfer(run(("cuda:1", "cuda:2"))) == "file"  # one NCCL group per learner and server
    assert weight_transfer(run(("cuda:1",), mode="async")) == "file"  # the collectors relay from the object store
    assert weight_transfer(run(("cuda:0",))) == "file"  # a shared GPU
    monkeypatch.setenv(KEY_ENV, "k" * 32)
    two = {
        "inference_model.engine": "vllm_server",
        "inference_model.weight_transfer": "nccl",
        "inference_model.urls": "[http://a:1,http://b:2]",
    }
    with pytest.raises(ConfigError, match="joins the learner and one server"):
        check_engine(_cfg(**two), _devices("cuda:0", "cuda:1"))


def test_an_idle_connection_is_dropped_before_the_server_would_close_it():
    """vLLM's server closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); a request the client sends on
    it just then fails with "Server disconnected without sending a response". The client reuses a connection only
    while it has been idle for less than ``IDLE_CONNECTION_SECONDS``, well below those 5 s."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from grpo_rl.engines.server_client import IDLE_CONNECTION_SECONDS, ServerClient

    connections = []

    class KeepAlive(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keeps the connection open between requests, as vLLM's server does

        def setup(self):
            super().setup()
            connections.append(self.client_address)

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = ServerClient(f"http://127.0.0.1:{server.server_address[1]}", key=None, timeout=10)
    try:
        client.get("/a")
        client.get("/b")  # at once: the same connection
        assert len(connections) == 1
        time.sleep(IDLE_CONNECTION_SECONDS + 0.5)
        client.get("/c")  # idle past the client's limit, still within the server's 5 s: a new connection
        assert len(connections) == 2
        assert IDLE_CONNECTION_SECONDS <= 5 / 2
    finally:
        client.close()
        server.shutdown()
        server.server_close()


def _adapter(scale: float) -> list[tuple[str, torch.Tensor]]:
    """An adapter's tensors as peft names them (rank 4 on one q_proj)."""
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    return [(f"{prefix}.lora_A.weight", torch.full((4, 8), scale)), (f"{prefix}.lora_B.weight", torch.ones(8, 4))]


def test_an_adapter_push_is_loaded_named_by_each_request_and_retired(stand_in, tmp_path):
    """``model.lora.push=adapter`` to servers: a push writes a peft folder the server loads as a new adapter; the
    requests that follow name it, and their tokens carry its version whatever the server's spans say; with one slot
    the three newest adapters are kept (a waiting request may still name one) and the older are unloaded."""
    from safetensors.torch import load_file

    from grpo_rl.engines.vllm_engine import AdapterSlots

    engine = ServedEngine(
        [stand_in.url], key="k", pad_id=0, timeout=10, weight_dir=str(tmp_path), adapters=AdapterSlots(8.0, 4)
    )
    try:
        engine.update_weights(_adapter(0.1), version=1)
        ((name, folder),) = stand_in.adapters.items()
        assert json_of(Path(folder) / "adapter_config.json")["r"] == 4
        assert torch.equal(
            load_file(Path(folder) / "adapter_model.safetensors")[_adapter(0)[0][0]], _adapter(0.1)[0][1]
        )
        assert not any(path == "/update_weights" for path, _ in stand_in.calls)  # no whole-model push
        batch = engine.generate([[10, 11]], 2, SamplingSpec(max_new_tokens=4, seed=5))
        (request,) = [body for path, body in stand_in.calls if path == "/inference/v1/generate"]
        assert request["model"] == name
        assert set(batch["behavior_version"][batch["response_mask"].bool()].tolist()) == {1}
        folders = [folder]
        for version in (2, 3, 4):
            engine.update_weights(_adapter(0.1 * version), version=version)
            folders.append(stand_in.adapters[max(stand_in.adapters, key=lambda n: int(n.split("-")[1]))])
        assert stand_in.version == "4" and len(stand_in.adapters) == 3 and name not in stand_in.adapters
        assert not Path(folders[0]).exists() and all(Path(f).is_dir() for f in folders[1:])
    finally:
        engine.shutdown()
    assert not Path(folders[-1]).exists()  # the adapters' folder goes with the engine


def test_a_server_without_runtime_adapters_is_named_with_the_fix(tmp_path):
    from grpo_rl.engines.vllm_engine import AdapterSlots

    server = StandIn(lora=False)
    engine = ServedEngine(
        [server.url], key="k", pad_id=0, timeout=10, weight_dir=str(tmp_path), adapters=AdapterSlots(8.0, 4)
    )
    try:
        with pytest.raises(RoleFailed, match="grpo_rl.cli.serve .*--enable-lora.*push=merged"):
            engine.update_weights(_adapter(0.1), version=1)
    finally:
        engine.shutdown()
        server.close()


def json_of(path: Path) -> dict:
    import json

    return json.loads(path.read_text())
