"""The synchronous source's healing: a collection that fails because an engine server the run started is gone is
made again, on a server started again with the newest weights, from the same stream position."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpo_rl.distributed.healing import Restarts
from grpo_rl.engines.server import ServerFleet
from grpo_rl.errors import RoleFailed
from grpo_rl.rollout.collector import CollectStats
from grpo_rl.rollout.source import InProcessRollouts
from grpo_rl.run.roles import served_healer
from tests.unit.rollout.streams import CountingEnv, StreamingCollector


def failing_collector(failures: int) -> StreamingCollector:
    """Fails its first ``failures`` collections after the first group (as a lost server does mid-batch)."""
    return StreamingCollector(fail=failures, error=RoleFailed("engine server http://127.0.0.1:1 is not reachable"))


def test_a_healed_collection_is_made_again_from_the_same_position():
    collector = failing_collector(failures=1)
    healed = []
    source = InProcessRollouts(collector, heal=lambda e: healed.append(str(e)) or True)
    rollout = source.next_batch(0)
    assert healed == ["engine server http://127.0.0.1:1 is not reachable"]
    assert collector.prompts == [0, 1, 0, 1]  # the second attempt drew the same prompts
    assert rollout.batch["group_index"].tolist() == [0, 0, 1, 1] and source.position.next_group == 2
    assert source.state_dict()["resets"] == 1


def test_without_healing_or_when_it_declines_the_failure_ends_the_run():
    with pytest.raises(RoleFailed):
        InProcessRollouts(failing_collector(failures=1)).next_batch(0)
    with pytest.raises(RoleFailed):
        InProcessRollouts(failing_collector(failures=1), heal=lambda e: False).next_batch(0)


class FakeFleet:
    lost, replace_lost = ServerFleet.lost, ServerFleet.replace_lost  # the fleet's own, over the fakes below

    def __init__(self, alive: list[bool]):
        self.alive = alive
        self.servers = [SimpleNamespace(url=f"http://127.0.0.1:{9000 + i}") for i in range(len(alive))]

    def healthy(self, index: int) -> bool:
        return self.alive[index]

    def replace(self, index: int) -> str:
        self.servers[index] = SimpleNamespace(url=f"http://127.0.0.1:{9100 + index}")
        self.alive[index] = True
        return self.servers[index].url

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]


class StandInFleet:
    """A fleet of stand-in vLLM servers (tests/engine_stand_in.py): a lost server is "started again" as a fresh
    stand-in, which holds no weights and no weight folder, as a new vLLM process would."""

    lost, replace_lost = ServerFleet.lost, ServerFleet.replace_lost

    def __init__(self, size: int, key: str):
        from tests.engine_stand_in import StandIn

        self.key, self.started = key, []
        self._new = lambda: StandIn(key=key)
        self.servers = [self._start() for _ in range(size)]

    def _start(self):
        server = self._new()
        self.started.append(server)
        return server

    def healthy(self, index: int) -> bool:
        import httpx

        try:
            return (
                httpx.get(
                    f"{self.servers[index].url}/weight_info", headers={"Authorization": f"Bearer {self.key}"}, timeout=5
                ).status_code
                == 200
            )
        except httpx.HTTPError:
            return False

    def replace(self, index: int) -> str:
        self.servers[index] = self._start()
        return self.servers[index].url

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def close(self) -> None:
        for server in self.started:
            server.close()


class GeneratingCollector:
    """Streams with the engine for real (group ``g``'s prompt is ``[10 + g]``, one answer each)."""

    def __init__(self, engine):
        self.env, self.engine = CountingEnv(), engine
        self.tokenizer = SimpleNamespace(pad_token_id=0)

    def stream(self, groups, prompts, version, max_in_flight):
        from grpo_rl.engines.base import GroupRequest, Live, SamplingSpec

        pending = iter(groups)
        requests = Live(lambda: None if (g := next(pending, None)) is None else GroupRequest(g, [10 + g], seed=g))
        for g, group in self.engine.stream(requests, 1, SamplingSpec(max_new_tokens=2), max_in_flight):
            group.set("group_index", torch.full((1,), g))
            yield g, group, CollectStats()


def test_a_lost_server_of_a_synchronous_run_is_started_again_with_the_newest_weights(tmp_path):
    """The synchronous loop's healer over a real served engine and in-place weight sync: server 1 is lost after two
    pushes; the collection that finds it gone is made again on a new server, which holds the newest push (its
    version and its tensors, read from the weight folder it was told anew), and the surviving server still does."""
    from grpo_rl.engines.served import ServedEngine
    from grpo_rl.weights.sync import InPlaceWeightSync

    fleet = StandInFleet(2, key="run-key")
    (tmp_path / "weights").mkdir()
    engine = ServedEngine(fleet.urls, key="run-key", pad_id=0, timeout=10, weight_dir=str(tmp_path / "weights"))
    sync = InPlaceWeightSync(engine)
    restarts = Restarts(1, tmp_path)
    source = InProcessRollouts(GeneratingCollector(engine), heal=served_healer(fleet, engine, sync, restarts))
    try:
        first = {"w": torch.randn(4, 3), "b": torch.randn(3)}
        newest = {"w": torch.randn(4, 3), "b": torch.randn(3)}
        sync.push(list(first.items()), 1)
        source.next_batch(1)
        sync.push(list(newest.items()), 2)
        lost = fleet.servers[1]
        lost.close()

        rollout = source.next_batch(2)

        new = fleet.servers[1]
        assert new is not lost and fleet.urls == [fleet.servers[0].url, new.url]
        assert restarts.metrics()["restarts/engine"] == 1
        for server in fleet.servers:  # the new server and the one that survived: the newest push, version 2
            assert server.version == "2" and sorted(server.weights) == ["b", "w"]
            assert all(torch.equal(server.weights[k], v) for k, v in newest.items())
        assert new.weight_dir == fleet.servers[0].weight_dir and Path(new.weight_dir).parent == tmp_path / "weights"
        # the batch was made again, from the same stream position, with the new server's answer among it
        assert rollout.batch["group_index"].tolist() == [2, 3] and source.position.next_group == 4
        assert [p for p, _ in new.calls].count("/inference/v1/generate") >= 1
        assert engine.version == 2
    finally:
        engine.shutdown()
        fleet.close()


def test_served_healer_restarts_only_the_lost_servers_pushes_again_and_keeps_its_budget(tmp_path):
    calls = []
    engine = SimpleNamespace(replace_server=lambda i, url: calls.append(("replace", i, url)))
    sync = SimpleNamespace(push_again=lambda: calls.append(("push",)))
    fleet = FakeFleet([True, False])
    restarts = Restarts(1, tmp_path)
    heal = served_healer(fleet, engine, sync, restarts)
    assert heal(RoleFailed("engine server http://127.0.0.1:9001 is not reachable"))
    assert calls == [("replace", 1, "http://127.0.0.1:9101"), ("push",)]
    assert fleet.urls == ["http://127.0.0.1:9000", "http://127.0.0.1:9101"]
    assert restarts.metrics()["restarts/engine"] == 1
    assert not heal(RoleFailed("a failure with every server up"))  # not the servers' doing: not healed
    fleet.alive[0] = False
    with pytest.raises(RoleFailed, match="pipeline.max_restarts=1"):
        heal(RoleFailed("engine server http://127.0.0.1:9000 is not reachable"))
