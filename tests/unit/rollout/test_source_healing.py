"""The synchronous source's healing: a collection that fails because an engine server the run started is gone is
made again, on a server started again with the newest weights, from the same stream position."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from grpo_rl.distributed.healing import Restarts
from grpo_rl.errors import RoleFailed
from grpo_rl.rollout.collector import CollectStats
from grpo_rl.rollout.source import InProcessRollouts
from grpo_rl.run.roles import served_healer


class CountingEnv:
    """An environment whose state is how many resets it had (each reset draws a batch of prompts)."""

    def __init__(self):
        self.resets = 0

    def reset(self):
        self.resets += 1

    def state_dict(self) -> dict:
        return {"resets": self.resets}

    def load_state_dict(self, state: dict) -> None:
        self.resets = state["resets"]


class FailingCollector:
    """Fails its first ``failures`` collections after drawing the prompts (as a lost server does mid-batch)."""

    def __init__(self, failures: int):
        self.env, self.failures, self.drawn = CountingEnv(), failures, []

    def collect(self, index: int, version: int):
        self.env.reset()
        self.drawn.append(self.env.resets)
        if self.failures:
            self.failures -= 1
            raise RoleFailed("engine server http://127.0.0.1:1 is not reachable")
        batch = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
        return batch, CollectStats()


def test_a_healed_collection_is_made_again_from_the_same_position():
    collector = FailingCollector(failures=1)
    healed = []
    source = InProcessRollouts(collector, heal=lambda e: healed.append(str(e)) or True)
    rollout = source.next_batch(0)
    assert healed == ["engine server http://127.0.0.1:1 is not reachable"]
    assert collector.drawn == [1, 1]  # the second attempt drew the same prompts
    assert rollout.batch["batch_index"].tolist() == [0, 0] and source.position.next_index == 1
    assert collector.env.resets == 1


def test_without_healing_or_when_it_declines_the_failure_ends_the_run():
    with pytest.raises(RoleFailed):
        InProcessRollouts(FailingCollector(failures=1)).next_batch(0)
    with pytest.raises(RoleFailed):
        InProcessRollouts(FailingCollector(failures=1), heal=lambda e: False).next_batch(0)


class FakeFleet:
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


def test_served_healer_restarts_only_the_lost_servers_pushes_again_and_keeps_its_budget(tmp_path):
    calls = []
    engine = SimpleNamespace(replace_server=lambda i, url: calls.append(("replace", i, url)))
    sync = SimpleNamespace(push_again=lambda: calls.append(("push",)))
    run = SimpleNamespace(engine_urls=())
    fleet = FakeFleet([True, False])
    restarts = Restarts(1, tmp_path)
    heal = served_healer(run, fleet, engine, sync, restarts)
    assert heal(RoleFailed("engine server http://127.0.0.1:9001 is not reachable"))
    assert calls == [("replace", 1, "http://127.0.0.1:9101"), ("push",)]
    assert run.engine_urls == ("http://127.0.0.1:9000", "http://127.0.0.1:9101")
    assert restarts.metrics()["restarts/engine"] == 1
    assert not heal(RoleFailed("a failure with every server up"))  # not the servers' doing: not healed
    fleet.alive[0] = False
    with pytest.raises(RoleFailed, match="pipeline.max_restarts=1"):
        heal(RoleFailed("engine server http://127.0.0.1:9000 is not reachable"))
