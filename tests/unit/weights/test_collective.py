"""The collective weight broadcast over gloo: layout, a push into a real engine in another process, timeouts."""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
import time

import torch
import torch.distributed as dist

from grpo_rl.model.loading import load_causal_lm
from grpo_rl.model.lora import hf_named_weights
from grpo_rl.weights.collective import TransportTimeout, WeightBroadcast, WeightLayout, plan_layout

CPU = torch.device("cpu")
HOST = "127.0.0.1"
SEQUENCES = torch.tensor([[1, 9690, 198, 22, 23, 24, 25, 26], [1, 4093, 198, 30, 31, 32, 33, 34]])  # [2, 8]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _spawn(target, *args) -> tuple[mp.Process, mp.Queue]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, results), daemon=True)
    child.start()
    return child, results


def _reap(child: mp.Process) -> None:
    child.join(timeout=20)
    if child.is_alive():
        child.kill()
        child.join(timeout=5)


@torch.no_grad()
def _sequence_logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token of ``ids`` ``[B, T]`` -> ``[B, T - 1]``."""
    logits = model(input_ids=ids).logits.float()  # [B, T, V]
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


@torch.no_grad()
def _perturb(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=gen) * 0.05)


def test_plan_layout_sends_tied_weights_once():
    emb = torch.randn(8, 4)
    named = [
        ("model.embed_tokens.weight", emb),
        ("model.norm.weight", torch.ones(4)),
        ("lm_head.weight", emb),
        ("half", torch.zeros(3, dtype=torch.bfloat16)),
        ("model.other.weight", emb.clone()),
    ]
    layout, tensors = plan_layout(named)
    assert layout.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    assert [(s.name, s.buffer, s.offset, s.shape) for s in layout.slots] == [
        ("model.embed_tokens.weight", 0, 0, (8, 4)),
        ("model.norm.weight", 0, 32, (4,)),
        ("model.other.weight", 0, 36, (8, 4)),
        ("half", 1, 0, (3,)),
    ]
    assert layout.buffers == (("float32", 68), ("bfloat16", 3))  # 32 + 4 + 32 floats: the embedding once
    assert tensors[0] is emb and len(tensors) == 4
    assert WeightLayout.from_bytes(layout.to_bytes()) == layout


def test_plan_layout_splits_buffers_at_bucket_bytes():
    named = [("a", torch.zeros(10)), ("b", torch.zeros(10)), ("c", torch.zeros(3)), ("d", torch.zeros(40))]
    layout, _ = plan_layout(named, bucket_bytes=16 * 4)
    assert layout.buffers == (("float32", 10), ("float32", 13), ("float32", 40))  # d alone exceeds the bucket
    assert [(s.buffer, s.offset) for s in layout.slots] == [(0, 0), (1, 0), (1, 10), (2, 0)]


def test_plan_layout_of_tiny_model_ties_lm_head(tiny_model):
    named = dict(hf_named_weights(tiny_model))
    layout, _ = plan_layout(named.items())
    assert layout.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    unique_numel = sum(p.numel() for p in tiny_model.parameters())  # parameters() lists a tied one once
    assert sum(numel for _, numel in layout.buffers) == unique_numel


def test_threads_roundtrip_dtypes_aliases_and_layout_changes():
    port, got, errors = _free_port(), [], []

    def receive_three() -> None:
        try:
            receiver = WeightBroadcast.connect(HOST, port, 1, 2, CPU, timeout_seconds=20)
            got.extend(receiver.receive() for _ in range(3))
            receiver.close()
        except Exception as e:  # reported to the main thread
            errors.append(e)

    thread = threading.Thread(target=receive_three, daemon=True)
    thread.start()
    emb = torch.randn(6, 4)
    named = [
        ("embed", emb),
        ("head", emb),
        ("half", torch.randn(5).to(torch.bfloat16)),
        ("norm", torch.randn(4)),
        ("step", torch.tensor(7)),
    ]
    sender = WeightBroadcast.connect(HOST, port, 0, 2, CPU, timeout_seconds=20, bucket_bytes=64)
    sent = []
    for version, pairs in [(1, named), (2, named), (3, named + [("extra", torch.arange(3.0))])]:
        sender.send(pairs, version)  # the second push has the first one's layout, so it sends none
        sent.append({name: t.clone() for name, t in pairs})
        emb += 1
    thread.join(timeout=30)
    sender.close()
    assert not errors and not thread.is_alive(), errors
    assert [version for version, _ in got] == [1, 2, 3]
    for (_, pairs), expected in zip(got, sent, strict=True):
        out = dict(pairs)
        assert set(out) == set(expected)
        for name, t in expected.items():
            assert out[name].dtype == t.dtype and torch.equal(out[name], t), name
        assert out["head"] is out["embed"]


def _engine_receiver(model_dir: str, port: int, default_port: int, results) -> None:
    """Rank 1: an engine in a process whose default process group exists already (as vLLM's would)."""
    from grpo_rl.engines.transformers_engine import TransformersEngine

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://{HOST}:{default_port}", rank=0, world_size=1)
        engine = TransformersEngine(model_dir, CPU)
        # Plain lists: torch would share tensors' memory through the queue, which dies with this process.
        out = {
            "before": _sequence_logprobs(engine.model, SEQUENCES).tolist(),
            "keys": sorted(engine.model.state_dict()),
        }
        receiver = WeightBroadcast.connect(HOST, port, 1, 2, CPU, timeout_seconds=60)
        for _ in range(2):
            version, named = receiver.receive()
            engine.update_weights(named)
            out[version] = (sorted(name for name, _ in named), _sequence_logprobs(engine.model, SEQUENCES).tolist())
        receiver.close()
        out["default_group_size"] = dist.get_world_size()
        dist.destroy_process_group()
        results.put(out)
    except BaseException as e:
        results.put(repr(e))


def test_push_into_engine_in_another_process(tiny_model_dir):
    port = _free_port()
    child, results = _spawn(_engine_receiver, str(tiny_model_dir), port, _free_port())
    try:
        model = load_causal_lm(str(tiny_model_dir), CPU, "float32", trainable=True).eval()
        sender = WeightBroadcast.connect(HOST, port, 0, 2, CPU, timeout_seconds=60)
        expected = {}
        for version in (1, 2):
            _perturb(model, seed=version)
            sender.send(hf_named_weights(model), version)
            expected[version] = _sequence_logprobs(model, SEQUENCES)
        out = results.get(timeout=60)
        sender.close()
    finally:
        _reap(child)
    assert isinstance(out, dict), out
    assert out["default_group_size"] == 1  # the engine's own default group was left alone
    assert (torch.tensor(out["before"]) - expected[1]).abs().max() > 1e-3  # the pushes change what the engine computes
    for version in (1, 2):
        names, logprobs = out[version]
        assert names == out["keys"]  # every weight arrived, lm_head.weight included
        torch.testing.assert_close(torch.tensor(logprobs), expected[version], atol=1e-4, rtol=0)


def _receive_once(port: int, timeout_seconds: float, results) -> None:
    """Rank 1: join and wait for one push; report how it ended and after how long."""
    start = joined = time.monotonic()
    try:
        receiver = WeightBroadcast.connect(HOST, port, 1, 2, CPU, timeout_seconds)
        joined = time.monotonic()
        receiver.receive()
        results.put(("received", "", 0.0, 0.0))
    except BaseException as e:
        end = time.monotonic()
        results.put((type(e).__name__, str(e), end - start, end - joined))


def test_receiver_times_out_naming_the_learner():
    """One receiver has no sender at all; the other's sender joins and then sends nothing. Both run at once."""
    lonely_port, idle_port = _free_port(), _free_port()
    lonely, lonely_results = _spawn(_receive_once, lonely_port, 3.0)
    idle, idle_results = _spawn(_receive_once, idle_port, 3.0)
    try:
        sender = WeightBroadcast.connect(HOST, idle_port, 0, 2, CPU, timeout_seconds=30)
        idle_kind, idle_message, _, idle_waited = idle_results.get(timeout=30)
        sender.close()
        lonely_kind, lonely_message, lonely_elapsed, _ = lonely_results.get(timeout=30)
    finally:
        _reap(lonely)
        _reap(idle)
    assert lonely_kind == TransportTimeout.__name__, lonely_message
    assert f"the learner (rank 0 at {HOST}:{lonely_port})" in lonely_message
    assert "pipeline.timeout_seconds" in lonely_message
    assert 3.0 <= lonely_elapsed < 12.0  # TCPStore retries once after a back-off: about 6 s for a 3 s limit
    assert idle_kind == TransportTimeout.__name__, idle_message
    assert f"the header of the next push with the learner (rank 0 at {HOST}:{idle_port})" in idle_message
    assert 3.0 <= idle_waited < 6.0
