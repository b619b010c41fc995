"""Weight transport through the Ray object store: aliases, dtypes, versions, and the push protocol."""

from __future__ import annotations

import os

import pytest
import torch

from grpo_rl.weights.sync import ObjectStoreWeightSync, pack_weights, split_aliases, unpack_weights

# Tests taking ``ray_local`` start a one-CPU Ray instance (about 5 s, once per module).
ray_tests = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    from omegaconf import OmegaConf

    from grpo_rl.config.schema import RayConfig
    from grpo_rl.placement.ray import start_ray, stop_ray

    started = start_ray(OmegaConf.structured(RayConfig(num_cpus=1)))  # on loopback, as a run's
    yield ray
    stop_ray(started)


def tied_weights() -> list[tuple[str, torch.Tensor]]:
    emb = torch.randn(8, 4)
    return [
        ("model.embed_tokens.weight", emb),
        ("model.norm.weight", torch.ones(4)),
        ("lm_head.weight", emb),
        ("model.other.weight", emb.clone()),
    ]


def test_split_aliases_finds_tied_tensors_only():
    base = torch.arange(12.0)
    unique, aliases = split_aliases(tied_weights() + [("a", base[:6]), ("b", base[6:]), ("c", base.view(2, 6))])
    assert aliases == {"lm_head.weight": "model.embed_tokens.weight"}  # a copy or a view is not an alias
    assert set(unique) == {"model.embed_tokens.weight", "model.norm.weight", "model.other.weight", "a", "b", "c"}


@ray_tests
def test_pack_unpack_roundtrip_restores_aliases_and_dtypes(ray_local):
    named = tied_weights() + [("half", torch.randn(3, 2).to(torch.bfloat16))]
    packet = pack_weights(named, version=7)
    assert packet.version == 7
    out = dict(unpack_weights(packet))
    assert set(out) == {name for name, _ in named}  # lm_head arrives under its own name too
    for name, t in named:
        assert out[name].dtype == t.dtype
        assert torch.equal(out[name], t)


@ray_tests
def test_packet_is_a_snapshot(ray_local):
    w = torch.zeros(3)
    packet = pack_weights([("w", w)], version=1)
    w += 1  # the optimizer keeps updating the learner's tensors in place
    assert torch.equal(dict(unpack_weights(packet))["w"], torch.zeros(3))


@ray_tests
def test_object_store_push_reaches_every_collector(ray_local):
    @ray_local.remote
    class FakeCollector:
        def __init__(self):
            self.got = []

        def set_weights(self, packet):
            self.got.append((packet.version, float(dict(unpack_weights(packet))["w"].sum())))

        def received(self):
            return self.got

    collectors = [FakeCollector.remote() for _ in range(2)]
    sync, w = ObjectStoreWeightSync(collectors, timeout=30), torch.zeros(4)
    for version in (1, 2):
        w += 1
        sync.push([("w", w)], version)
    sync.push([("w", w)], 3)  # waits for the previous push: its errors would surface here
    for c in collectors:
        assert ray_local.get(c.received.remote())[:2] == [(1, 4.0), (2, 8.0)]


@ray_tests
def test_delivered_waits_until_a_threaded_collector_holds_the_push(ray_local):
    """Collectors are threaded actors: a call made after a push (an evaluation) may run before the push's
    ``set_weights``; ``delivered`` returns only once every collector holds it."""
    import threading
    import time

    @ray_local.remote(max_concurrency=4)
    class SlowCollector:
        def __init__(self):
            self.version, self.lock = 0, threading.Lock()

        def set_weights(self, packet):
            time.sleep(2.0)
            with self.lock:
                self.version = packet.version

        def current(self):
            with self.lock:
                return self.version

    collectors = [SlowCollector.remote() for _ in range(2)]
    sync = ObjectStoreWeightSync(collectors, timeout=60)
    sync.push([("w", torch.zeros(2))], 1)
    assert sync.delivered() > 0.5  # it waited for the slow set_weights
    assert ray_local.get([c.current.remote() for c in collectors]) == [1, 1]


@ray_tests
def test_a_collector_that_dies_taking_weights_is_named_on_one_line(ray_local):
    from grpo_rl.errors import RoleFailed

    @ray_local.remote(max_restarts=0)
    class FakeCollector:
        def __init__(self, dies: bool):
            self.dies = dies

        def set_weights(self, packet):
            if self.dies:
                os._exit(1)

    sync = ObjectStoreWeightSync([FakeCollector.remote(False), FakeCollector.remote(True)], timeout=300)
    sync.push([("w", torch.zeros(2))], 1)
    with pytest.raises(RoleFailed) as failed:
        sync.push([("w", torch.ones(2))], 2)
    message = str(failed.value)
    assert message.startswith("collector replica 1 died while taking the weights") and "\n" not in message, message


def test_in_place_sync_reloads_the_engine_and_accepts_a_packet(ray_local):
    from grpo_rl.weights.sync import InPlaceWeightSync, pack_weights

    class Engine:
        loaded = None
        version = None

        def update_weights(self, named, version=None):
            self.loaded = {k: v.clone() for k, v in named}
            self.version = version

    engine = Engine()
    sync = InPlaceWeightSync(engine)
    sync.push([("w", torch.ones(2))], 1)
    assert sync.version == 1 and engine.version == 1 and torch.equal(engine.loaded["w"], torch.ones(2))
    sync.push(pack_weights([("w", torch.full((2,), 3.0))], 2), 2)  # a data-parallel group's packet
    assert sync.version == 2 and torch.equal(engine.loaded["w"], torch.full((2,), 3.0))
