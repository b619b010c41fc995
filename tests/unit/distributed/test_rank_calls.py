"""How the learner group reads one call per rank (:func:`~grpo_rl.distributed.learner_group.gather_ranks`), with
Ray actors standing in for the ranks: a rank that dies is the loss of a rank (which a restart heals) even when a
peer's collective fails first, as a killed rank's peers' collectives do at once; a rank that raises with every
rank alive is the failure of a rank."""

from __future__ import annotations

import os
import time

import pytest
from omegaconf import OmegaConf

from grpo_rl.errors import LearnerLost, RoleFailed

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

PEER_CLOSED = "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40125"


@pytest.fixture(scope="module")
def ranks():
    """A local Ray instance; returns a maker of two stand-in ranks and their process ids."""
    from grpo_rl.config.schema import RayConfig
    from grpo_rl.placement.ray import start_ray, stop_ray

    if ray.is_initialized():
        pytest.skip("Ray is already running in this process")

    @ray.remote(num_cpus=0)
    class Rank:
        def pid(self) -> int:
            return os.getpid()

        def peer_lost(self) -> None:
            raise RuntimeError(PEER_CLOSED)

        def die_after(self, seconds: float) -> None:
            time.sleep(seconds)
            os._exit(1)

        def answer(self, value: int, seconds: float = 0.0) -> int:
            time.sleep(seconds)
            return value

    def make() -> tuple[list, list[int]]:
        actors = [Rank.remote() for _ in range(2)]
        return actors, ray.get([a.pid.remote() for a in actors], timeout=120)

    started = start_ray(OmegaConf.structured(RayConfig(num_cpus=1)))
    try:
        yield make
    finally:
        stop_ray(started)


def test_a_rank_that_dies_after_its_peer_failed_is_a_lost_rank(ranks):
    """Rank 0's collective fails at once; rank 1's death is known a second later: the group lost rank 1."""
    from grpo_rl.distributed.learner_group import gather_ranks

    (a, b), pids = ranks()
    calls = [a.peer_lost.remote(), b.die_after.remote(1.0)]
    with pytest.raises(LearnerLost) as lost:
        gather_ranks(calls, "a training step", timeout=60, pids=pids)
    assert str(lost.value) == (
        f"learner rank 1 (pid {pids[1]}) died during a training step (its process was killed or crashed)"
    )


def test_a_peer_failure_without_a_death_within_the_grace_is_a_failed_rank(ranks):
    """The same first error with a death later than the grace: the rank failed (the run ends on it)."""
    from grpo_rl.distributed.learner_group import gather_ranks

    (a, b), pids = ranks()
    calls = [a.peer_lost.remote(), b.die_after.remote(3.0)]
    with pytest.raises(RoleFailed) as failed:
        gather_ranks(calls, "a training step", timeout=60, pids=pids, grace=0.5)
    assert not isinstance(failed.value, LearnerLost)
    assert str(failed.value).startswith("a learner rank failed during a training step") and PEER_CLOSED in str(
        failed.value
    )


def test_an_error_with_every_rank_alive_is_a_failed_rank_and_answers_come_in_rank_order(ranks):
    from grpo_rl.distributed.learner_group import gather_ranks

    (a, b), pids = ranks()
    with pytest.raises(RoleFailed) as failed:
        gather_ranks([a.answer.remote(1, 0.3), b.peer_lost.remote()], "a checkpoint", timeout=60, pids=pids)
    assert not isinstance(failed.value, LearnerLost)
    assert gather_ranks([a.answer.remote(1, 0.3), b.answer.remote(2)], "a checkpoint", timeout=60, pids=pids) == [1, 2]


def test_ranks_that_do_not_answer_in_time_are_lost(ranks):
    from grpo_rl.distributed.learner_group import gather_ranks

    (a, b), pids = ranks()
    with pytest.raises(LearnerLost, match=r"did not finish a weight gather within pipeline.timeout_seconds=0.5"):
        gather_ranks([a.answer.remote(1), b.answer.remote(2, 5.0)], "a weight gather", timeout=0.5, pids=pids)
