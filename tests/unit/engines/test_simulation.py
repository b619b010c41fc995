"""The timed stand-ins of grpo_rl/training/simulated.py: the engine's batch layout, the shares of a sharded stage, and
the settings that choose roles and placements."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.engines import simulated
from grpo_rl.engines.base import SamplingSpec
from grpo_rl.engines.simulated import SimulatedEngine
from grpo_rl.errors import ConfigError
from grpo_rl.run.preflight import validate
from grpo_rl.training.simulated import SimulatedLearner, SimulatedRefScorer


class FakeClock:
    """The ``time`` of grpo_rl.engines.simulated (whose sleep the training stand-ins use too): ``sleep`` records
    what it was asked and moves the clock on at once; ``midway``, if given, runs halfway through the first sleep
    (a push that lands while a batch is generated)."""

    def __init__(self, midway=None):
        self.now, self.slept, self.midway = 100.0, [], midway

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        midway, self.midway = self.midway, None
        if midway is not None:
            self.now += seconds / 2
            midway()
            seconds /= 2
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(simulated, "time", clock)
    return clock


def test_simulated_engine_returns_the_engine_layout_after_its_time(clock):
    engine = SimulatedEngine(vocab_size=50, seconds=0.05, jitter=0.0, answer_tokens=6, pad_id=0)
    batch = engine.generate([[1, 2, 3], [4]], 3, SamplingSpec(max_new_tokens=4, seed=7))
    assert clock.slept == [0.05]  # one batch, its generation time
    assert batch.batch_size == torch.Size([6])
    assert batch["response_ids"].shape == (6, 4)  # min(answer_tokens, max_new_tokens)
    assert batch["group_id"].tolist() == [0, 0, 0, 1, 1, 1]
    assert int(batch["prompt_mask"][3].sum()) == 1 and bool((batch["response_ids"] < 50).all())
    again = engine.generate([[1, 2, 3], [4]], 3, SamplingSpec(max_new_tokens=4, seed=7))
    assert torch.equal(again["response_ids"], batch["response_ids"])  # seeded like a real engine


def test_stand_ins_take_their_share_of_a_batch(clock):
    from tensordict import TensorDict

    def batch(rows):
        return TensorDict(
            {"behavior_logprobs": torch.full((rows, 3), -1.0), "response_mask": torch.ones(rows, 3, dtype=torch.long)},
            batch_size=[rows],
        )

    learner = SimulatedLearner(
        torch.nn.Linear(2, 2), torch.device("cpu"), seconds=0.2, jitter=0.0, batch_rows=8, epochs=2
    )
    metrics = learner.train_step(batch(2))  # a quarter of the batch: 0.05 s per optimizer step, 2 epochs
    assert clock.slept == pytest.approx([0.05, 0.05]) and learner.version == 2
    assert metrics["simulated_training_seconds"] == pytest.approx(0.1)
    ref = SimulatedRefScorer(seconds=0.2, jitter=0.0, batch_rows=8)
    scored = ref.score(batch(4))  # half the batch: half the reference's time
    assert clock.slept[2:] == pytest.approx([0.1])
    assert torch.equal(scored["ref_logprobs"], scored["behavior_logprobs"])


def _cfg(**overrides):
    return OmegaConf.merge(
        OmegaConf.structured(GRPOConfig), OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()])
    )


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"train_model.sharding": "zero3"}, "train_model.sharding"),
        ({"ref_model.placement": "gpu"}, "ref_model.placement"),
        ({"ref_model.placement": "actor", "model.lora.enabled": True}, "ref_model.placement=actor"),
        ({"train_model.sharding": "fsdp", "model.lora.enabled": True}, "train_model.sharding=fsdp"),
        ({"pipeline.weight_transport": "nccl"}, "pipeline.weight_transport"),
        ({"pipeline.timeout_seconds": 0}, "pipeline.timeout_seconds"),
        ({"simulate.training_seconds": -1}, "simulate.training_seconds"),
    ],
)
def test_role_settings_are_checked(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(_cfg(**overrides))


def test_fsdp_needs_two_training_devices(tiny_model_dir, tmp_path):
    from grpo_rl.run.setup import make_run

    with pytest.raises(ConfigError, match="train_model.num_devices to 2"):
        make_run(_cfg(**{"model.name": str(tiny_model_dir), "train_model.sharding": "fsdp"}), tmp_path)


def test_the_simulated_engine_stamps_tokens_sampled_after_an_inflight_push(clock):
    import random

    from grpo_rl.rollout.collector import oldest_token_version

    engine = SimulatedEngine(vocab_size=100, seconds=0.6, jitter=0.0, answer_tokens=40, pad_id=0, long_tail=1.0)
    engine.rng = random.Random(0)  # the answers' lengths
    clock.midway = lambda: engine.update_weights([], version=5)  # the push lands halfway through the batch
    batch = engine.generate([[1], [2]], 4, SamplingSpec(max_new_tokens=40))
    assert clock.slept == [0.6]
    lengths = batch["response_mask"].sum(-1)
    assert lengths.max() == 40 and lengths.min() < 40  # a long tail: the longest answer sets the batch's time
    versions = batch["behavior_version"][batch["response_mask"].bool()]
    assert set(versions.tolist()) == {0, 5}  # tokens before the push and after it
    longest = int(lengths.argmax())
    assert batch["behavior_version"][longest, 0] == 0 and batch["behavior_version"][longest, 39] == 5
    assert oldest_token_version(batch, default=9).tolist() == batch["behavior_version"][:, 0].tolist()
    again = engine.generate([[1]], 2, SamplingSpec(max_new_tokens=40))  # a batch begun after the push
    assert (again["behavior_version"][again["response_mask"].bool()] == 5).all()


class _Lengths:
    """The simulated engine's random draws, chosen: ``expovariate`` answers from ``draws`` (with ``long_tail=1`` an
    answer's share of the full time is ``exp(-draw)``), ``gauss`` 0 (no jitter)."""

    def __init__(self, *shares: float):
        import math

        self.draws = [-math.log(u) for u in shares]

    def expovariate(self, rate: float) -> float:
        return self.draws.pop(0)

    def gauss(self, mu: float, sigma: float) -> float:
        return 0.0


def _stream_ends(clock, engine, groups: int, n: int, max_in_flight: int) -> list[tuple[int, float, list[int]]]:
    from grpo_rl.engines.base import GroupRequest

    requests = [GroupRequest(key=k, prompt=[1], seed=k) for k in range(groups)]
    start, out = clock.now, []
    for key, rows in engine.stream(iter(requests), n, SamplingSpec(max_new_tokens=40), max_in_flight):
        out.append((key, round(clock.now - start, 6), rows["response_mask"].sum(-1).tolist()))
    return out


def test_a_long_answer_holds_its_own_place_only_the_next_group_takes_the_others(clock):
    # two places; group 0's answers take 1 s and 0.5 s, group 1's 0.5 s and 0.25 s: group 1 starts in the place of
    # group 0's short answer and ends before group 0 does, where a group-sized place would start it at 1 s
    engine = SimulatedEngine(
        vocab_size=50, seconds=1.0, jitter=0.0, answer_tokens=40, pad_id=0, long_tail=1.0, max_num_seqs=2
    )
    engine.rng = _Lengths(1.0, 0.5, 0.5, 0.25)
    ends = _stream_ends(clock, engine, groups=2, n=2, max_in_flight=2)
    # group 1's first answer runs 0.5-1.0 s in the place freed at 0.5 s, its second 1.0-1.25 s in the next one
    assert ends == [(0, 1.0, [40, 20]), (1, 1.25, [20, 10])]
    engine.rng = _Lengths(1.0, 0.5, 0.5, 0.25)
    engine.max_num_seqs = 3  # a third place: group 1's short answers both fit beside group 0's long one
    assert _stream_ends(clock, engine, groups=2, n=2, max_in_flight=2) == [(1, 0.75, [20, 10]), (0, 1.0, [40, 20])]


def test_groups_beyond_the_engines_places_wait_their_turn(clock):
    engine = SimulatedEngine(vocab_size=50, seconds=1.0, jitter=0.0, answer_tokens=8, pad_id=0, max_num_seqs=2)
    # one group's two answers fill the engine: three groups drawn at once end one after another
    assert _stream_ends(clock, engine, groups=3, n=2, max_in_flight=3) == [
        (0, 1.0, [8, 8]),
        (1, 2.0, [8, 8]),
        (2, 3.0, [8, 8]),
    ]
    engine.max_num_seqs = None  # as many places as the groups in flight have answers: all at once
    assert [t for _, t, _ in _stream_ends(clock, engine, groups=3, n=2, max_in_flight=3)] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"pipeline.groups_in_flight": 0}, "pipeline.groups_in_flight"),
        ({"pipeline.groups_in_flight": 8, "pipeline.whole_batches": True}, "pipeline.groups_in_flight=8"),
        ({"simulate.max_num_seqs": 0}, "simulate.max_num_seqs"),
    ],
)
def test_the_streaming_settings_are_checked(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(_cfg(**overrides))
