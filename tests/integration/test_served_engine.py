"""A real vLLM server of the tiny model, started the way a run starts one: its answers equal the in-process
engine's, pushed weights land (and are read back), every path needs the key, and an answer in flight across a push
keeps, token by token, the log-prob and version of the weights that sampled it."""

from __future__ import annotations

import copy
import os
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from grpo_rl.engines.base import GroupRequest, SamplingSpec, concat_batches
from grpo_rl.engines.served import ServedEngine
from grpo_rl.engines.server import ServerFleet, ServerSpec, engine_args
from tests.sockets import listening_of

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 1024


def cpu_engine_args(adapters=None) -> tuple[str, ...]:
    """The engine flags of the tiny model's CPU server (``adapters``: it loads pushed LoRA adapters)."""
    return engine_args(
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        seed=0,
        kv_cache_gb=0.25,
        gpu_memory_utilization=0.5,
        enforce_eager=True,
        enable_prefix_caching=True,
        on_cpu=True,
        adapters=adapters,
    )


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    args = cpu_engine_args()
    # Four sequences at a time: more requests wait their turn, so a push lands while answers are under way
    # (this model samples a whole answer in well under a second).
    args += ("--max-num-seqs", "4")
    servers = ServerFleet(
        [ServerSpec(str(tiny_model_dir), torch.device("cpu"), threads=1, vllm_args=args)],
        tmp_path_factory.mktemp("servers"),
        start_timeout=300,
    )
    yield servers
    servers.close()


@pytest.fixture
def engine(fleet, tokenizer):
    engine = ServedEngine(fleet.urls, key=fleet.key, pad_id=tokenizer.pad_token_id or 0, timeout=120)
    yield engine
    engine.shutdown()


def learner_logprobs(model, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """The plain forward's log-probs of ``answer`` after ``prompt`` (temperature 1, no truncation)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(answer)[:, None])[:, 0]


def perturbed(model, seed: int, scale: float = 0.05):
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return out


def answers(batch, j: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    n = int(batch["response_mask"][j].sum())
    return (batch["response_ids"][j, :n].tolist(), batch["behavior_logprobs"][j, :n], batch["behavior_version"][j, :n])


def streamed(engine, prompts: list[list[int]], spec: SamplingSpec, max_in_flight: int):
    """The groups ``engine.stream`` yields for ``prompts`` (seeded as one ``generate`` call seeds them), put back in
    prompt order as one batch, and the order they came in."""
    requests = [GroupRequest(key=i, prompt=p, seed=spec.seed + i * 4) for i, p in enumerate(prompts)]
    groups = dict(engine.stream(iter(requests), 4, spec, max_in_flight))
    return concat_batches([groups[i] for i in range(len(prompts))], engine.pad_id), list(groups)


def assert_same_answers(a, b) -> None:
    for key in ("prompt_ids", "response_ids", "response_mask", "group_id", "truncated"):
        assert torch.equal(a[key], b[key]), key
    torch.testing.assert_close(a["behavior_logprobs"], b["behavior_logprobs"], rtol=0, atol=1e-5)


def test_served_answers_equal_the_in_process_engines(engine, tiny_model_dir, tokenizer):
    """Same seed, same tokens; log-probs (processed: temperature, top-k, top-p) equal to 1e-5: the same kernels,
    batched differently (one request per prompt here, one call for all prompts in-process). Both engines' streams
    (groups yielded as they finish, with fewer in flight than there are prompts) sample what ``generate`` does."""
    from grpo_rl.engines.vllm_engine import VLLMEngine

    prompts = [tokenizer.encode(t) for t in ("What is 2 + 3?", "Name a colour.", "Count to five:")]
    specs = [
        SamplingSpec(max_new_tokens=24, temperature=0.8, top_p=0.9, top_k=50, seed=11),
        SamplingSpec(max_new_tokens=24, seed=3, stop=("e",)),
    ]  # a stop string: ends most answers early
    served = [engine.generate(prompts, 4, s) for s in specs]
    local = VLLMEngine(str(tiny_model_dir), torch.device("cpu"), max_model_len=MAX_MODEL_LEN, seed=0, kv_cache_gb=0.25)
    try:
        in_process = [local.generate(prompts, 4, s) for s in specs]
        local_streams = [streamed(local, prompts, s, m) for s, m in zip(specs, (3, 2), strict=True)]
        # a consumer that stops after the first group: the others are abandoned, and the engine is idle again
        reqs = [GroupRequest(key=i, prompt=p, seed=i) for i, p in enumerate(prompts)]
        stream = local.stream(iter(reqs), 4, specs[0], 3)
        next(stream)
        stream.close()
        assert not local.llm.llm_engine.has_unfinished_requests()
    finally:
        local.shutdown()
    served_streams = [streamed(engine, prompts, s, 2) for s in specs]
    for a, b in zip(served, in_process, strict=True):
        assert_same_answers(a, b)
    for (a, order), b in zip(local_streams + served_streams, in_process + in_process, strict=True):
        assert sorted(order) == [0, 1, 2]
        assert_same_answers(a, b)
    stopped = served[1]
    assert not stopped["truncated"].all()  # the stop string ended some answers, and it stays in them
    for j in torch.nonzero(~stopped["truncated"]).flatten().tolist():
        ids = answers(stopped, j)[0]
        assert "e" in tokenizer.decode(ids[-1:]) or ids[-1] == tokenizer.eos_token_id


def test_two_pushes_land_and_are_read_back(engine, fleet, tiny_model):
    prompt = [1, 2, 3, 4, 5]
    for version in (1, 2):
        model = perturbed(tiny_model, seed=version)
        engine.update_weights(model.state_dict().items(), version)
        with _client(fleet, Authorization=f"Bearer {fleet.key}") as client:
            assert client.get("/weight_info").json()["weight_version"] == str(version)
    batch = engine.generate([prompt], 2, SamplingSpec(max_new_tokens=32, seed=1))
    for j in range(2):
        ids, behavior, versions = answers(batch, j)
        assert (versions == 2).all()
        torch.testing.assert_close(behavior, learner_logprobs(model, prompt, ids), rtol=0, atol=1e-4)


def _client(fleet, **headers) -> httpx.Client:
    """A raw client of the fleet's one server, on its Unix socket."""
    path = fleet.urls[0].removeprefix("unix:")
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=path),
        base_url="http://localhost",
        headers=headers,
        timeout=30,
        trust_env=False,
    )


def test_every_path_needs_the_key(fleet):
    """Every route the server's app has (from its own OpenAPI listing), the mounts outside that listing and a
    websocket upgrade: refused without the key and with a wrong one, before the app sees the request."""
    keyed, bare, wrong = (
        _client(fleet, Authorization=f"Bearer {fleet.key}"),
        _client(fleet),
        _client(fleet, Authorization="Bearer not-the-key"),
    )
    listed = keyed.get("/openapi.json").json()["paths"]
    routes = [
        (method.upper(), path.replace("{", "").replace("}", ""))
        for path, methods in listed.items()
        for method in methods
    ]
    routes += [("GET", p) for p in ("/metrics", "/docs", "/openapi.json", "/ping", "/redoc", "/no-such-route")]
    routes += [("POST", "/invocations"), ("GET", "/grpo_rl/model")]
    assert len(routes) > 40 and ("POST", "/update_weights") in routes and ("POST", "/collective_rpc") in routes
    for method, path in routes:
        for client in (bare, wrong):
            response = client.request(method, path, json={})
            assert response.status_code == 401 and response.json() == {"error": "Unauthorized"}, (method, path)
    upgrade = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    assert bare.get("/v1/realtime", headers=upgrade).status_code in (401, 403)  # closed before the app
    generate = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}}
    assert keyed.post("/inference/v1/generate", json=generate).status_code == 200
    assert keyed.post("/pause").status_code == 200 and keyed.post("/resume").status_code == 200
    assert keyed.post("/collective_rpc", json={"method": "check_health"}).status_code == 200
    for client in (keyed, bare, wrong):
        client.close()


def test_the_server_proves_its_key_names_its_model_and_listens_on_no_port(fleet, tiny_model_dir):
    import os
    import stat

    from grpo_rl.engines.server_client import ServerClient, model_identity
    from grpo_rl.errors import RoleFailed

    client = ServerClient(fleet.urls[0], fleet.key, timeout=30)
    client.verify()
    expected = model_identity(str(tiny_model_dir))
    assert client.get("/grpo_rl/model") == expected and expected["hidden_size"] == 64
    with pytest.raises(RoleFailed, match="holds another model than the run's \\(hidden_size 64 there, 128"):
        client.check_model({**expected, "hidden_size": 128})
    client.close()
    impostor = ServerClient(fleet.urls[0], "x" * 43, timeout=30)
    with pytest.raises(RoleFailed, match="was started with another key"):
        impostor.get("/health")
    folder = fleet.socket_dir.stat()
    assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.getuid()
    pid = fleet.servers[0].process.pid
    assert listeners_of_session(pid) == [], "a server of the run listens beyond loopback"


def listeners_of_session(sid: int) -> list[str]:
    """Sockets of session ``sid``'s processes that listen (TCP) or are bound (UDP) beyond loopback."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]) == sid:
                pids.append(int(pid))
        except (OSError, IndexError, ValueError):
            continue
    return [str(s) for found in listening_of(pids).values() for s in found if not s.loopback]


def test_an_answer_across_an_inflight_push_keeps_each_tokens_version_and_logprob(engine, tiny_model):
    """Push B while an answer is sampled under A (``/pause?mode=keep``): its tokens carry two versions; those of A
    have A's log-probs, those of B do not, and the engine correction against the learner (now B) weighs the A
    tokens by exactly pi_B / pi_A."""
    from grpo_rl.algo.engine_correction import engine_weights
    from grpo_rl.rollout.collector import oldest_token_version

    engine.inflight = True
    a, b = perturbed(tiny_model, seed=10), perturbed(tiny_model, seed=11)
    prompts = [[1, 2, 3, 4 + i] for i in range(16)]
    wait = 1.0  # seconds into the generation: 16 answers of up to 1020 tokens, four at a time, take seconds
    for trial in range(4):  # until the push lands mid-answer
        va, vb = 10 + 2 * trial, 11 + 2 * trial
        engine.update_weights(a.state_dict().items(), va)
        out = {}
        spec = SamplingSpec(max_new_tokens=MAX_MODEL_LEN - 4, seed=trial)
        thread = threading.Thread(
            target=lambda out=out, spec=spec: out.setdefault("batch", engine.generate(prompts, 1, spec))
        )
        thread.start()
        time.sleep(wait)
        wait = wait / 2 if not thread.is_alive() else wait * 1.5  # too late: earlier next time; too early: later
        engine.update_weights(b.state_dict().items(), vb)
        thread.join()
        rows = [answers(out["batch"], j) for j in range(len(prompts))]
        mixed = [j for j, (_, _, v) in enumerate(rows) if (v == va).any() and (v == vb).any()]
        if mixed:
            break
    else:
        pytest.fail("no push landed while an answer was in flight")
    batch = out["batch"]
    assert {int(v) for _, _, v in rows for v in v.unique()} == {va, vb}
    for prompt, (row_ids, row_behavior, row_versions) in zip(
        prompts, rows, strict=True
    ):  # answers begun after the push: B's
        if (row_versions == vb).all():
            torch.testing.assert_close(row_behavior, learner_logprobs(b, prompt, row_ids), rtol=0, atol=1e-4)
        elif (row_versions == va).all():
            torch.testing.assert_close(row_behavior, learner_logprobs(a, prompt, row_ids), rtol=0, atol=1e-4)
    assert oldest_token_version(batch, default=-1).tolist() == [int(v[0]) for _, _, v in rows]
    prompt, (ids, behavior, versions) = prompts[mixed[0]], rows[mixed[0]]
    assert oldest_token_version(batch[mixed[0] : mixed[0] + 1], default=-1).tolist() == [va]  # the oldest token's
    old, new = versions == va, versions == vb
    assert (old | new).all() and old[: int(old.sum())].all()  # A's tokens first, then B's
    lp_a, lp_b = learner_logprobs(a, prompt, ids), learner_logprobs(b, prompt, ids)
    torch.testing.assert_close(behavior[old], lp_a[old], rtol=0, atol=1e-4)
    assert (behavior[new] - lp_a[new]).abs().max() > 1e-2  # B's tokens were not sampled by A
    w = engine_weights(lp_b[None], behavior[None], torch.ones(1, len(ids)), mode="token_truncate", cap=1e30)
    torch.testing.assert_close(w.raw[0, old], torch.exp(lp_b[old] - lp_a[old]), rtol=1e-3, atol=0)


def test_the_key_check_is_the_outermost_layer_of_the_servers_app(monkeypatch, tiny_model_dir):
    """The app vLLM builds from the serve command's flags: the key middleware comes first, before vLLM's own
    (Prometheus, CORS, scaling), so no route, mount or middleware sees a request without the key."""
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from grpo_rl.cli.serve import vllm_argv
    from grpo_rl.engines.vllm_plugin import KEY_ENV, RequireKey

    monkeypatch.setenv(KEY_ENV, "k" * 43)
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(vllm_argv(["--model", str(tiny_model_dir)]))
    app = build_app(args, supported_tasks=("generate",))
    layers = [m.cls for m in app.user_middleware]
    assert layers[0] is RequireKey and len(layers) > 1, layers


def test_a_server_samples_with_each_pushed_adapter_as_the_lora_learner_scores(tiny_model_dir, tokenizer, tmp_path):
    """``model.lora.push=adapter`` with a server the run starts (``--enable-lora``): after each of two adapter
    pushes the server samples with the new adapter on its unchanged base weights, its log-probs the learner's (1e-4,
    fp32), each token stamped with the push's version."""
    from grpo_rl.engines.vllm_engine import AdapterSlots
    from tests.integration.helpers import follow_adapter_pushes, lora_learner

    model, learner = lora_learner(tiny_model_dir)
    slots = AdapterSlots(8.0, 4)
    fleet = ServerFleet(
        [ServerSpec(str(tiny_model_dir), torch.device("cpu"), threads=1, vllm_args=cpu_engine_args(slots))],
        tmp_path,
        start_timeout=300,
    )
    engine = ServedEngine(fleet.urls, key=fleet.key, pad_id=tokenizer.pad_token_id or 0, timeout=120, adapters=slots)
    prompts = [tokenizer.encode("The quick brown fox " * 20, add_special_tokens=False), [1, 2, 3]]
    try:
        afters = follow_adapter_pushes(engine, engine.update_weights, model, learner, prompts)
        for version, after in enumerate(afters, start=1):
            assert set(after["behavior_version"][after["response_mask"].bool()].tolist()) == {version}
        served = {m["id"] for m in engine.servers[0].get("/v1/models")["data"]}
        assert {"policy-1-v1", "policy-2-v2"} <= served  # loaded by the server, as adapters of its one base model
    finally:
        engine.shutdown()
        fleet.close()
