"""The streaming side of the engine protocol: groups handed back as they finish, requests drawn as room frees up,
and for engines that finish a call at once (transformers, simulated) the same samples as one ``generate``."""

from __future__ import annotations

import threading

import pytest
import torch

from grpo_rl.engines.base import (
    GroupRequest,
    SamplingSpec,
    concat_batches,
    pack_rollouts,
    split_groups,
    stream_by_calls,
)
from grpo_rl.engines.transformers_engine import TransformersEngine

SPEC = SamplingSpec(max_new_tokens=5, seed=7)


class Recorder:
    """A ``generate`` that answers prompt ``p`` with ``n`` copies of ``p`` and records each call's prompts and seed."""

    def __init__(self):
        self.calls: list[tuple[list[list[int]], int | None]] = []

    def __call__(self, prompts, n, sampling):
        self.calls.append(([list(p) for p in prompts], sampling.seed))
        answers = [list(p) for p in prompts for _ in range(n)]
        return pack_rollouts(prompts, answers, [[0.0] * len(a) for a in answers], [False] * len(answers), n, 0)


def requests(seeds, drawn: list[int] | None = None):
    for i, seed in enumerate(seeds):
        if drawn is not None:
            drawn.append(i)
        yield GroupRequest(key=100 + i, prompt=[i + 1] * (i + 1), seed=seed)


def test_a_batchs_requests_share_a_call_and_come_back_as_its_groups():
    generate = Recorder()
    out = list(stream_by_calls(generate, requests([7, 9, 11]), 2, SPEC, max_in_flight=8))
    assert generate.calls == [([[1], [2, 2], [3, 3, 3]], 7)]  # seeds 7 + i * 2: one call, seeded as the batch
    assert [key for key, _ in out] == [100, 101, 102]
    for i, (_, rows) in enumerate(out):
        assert rows.batch_size == torch.Size([2]) and rows["group_id"].tolist() == [0, 0]
        assert rows["response_ids"][:, : i + 1].tolist() == [[i + 1] * (i + 1)] * 2
    # the groups of one call joined again are the call's batch
    whole = generate([[1], [2, 2], [3, 3, 3]], 2, SPEC)
    assert (concat_batches([rows for _, rows in out], pad_id=0) == whole).all()


def test_seeds_that_do_not_follow_each_other_are_separate_calls_and_room_bounds_a_call():
    generate = Recorder()
    list(stream_by_calls(generate, requests([7, 9, 3, 5, None, None]), 2, SPEC, max_in_flight=8))
    assert [seed for _, seed in generate.calls] == [7, 3, None]
    generate = Recorder()
    list(stream_by_calls(generate, requests([1, 3, 5, 7, 9]), 2, SPEC, max_in_flight=2))
    assert [len(prompts) for prompts, _ in generate.calls] == [2, 2, 1]
    with pytest.raises(ValueError, match="max_in_flight"):
        list(stream_by_calls(generate, requests([1]), 2, SPEC, max_in_flight=0))


def test_requests_are_drawn_only_when_there_is_room():
    drawn: list[int] = []
    stream = stream_by_calls(Recorder(), requests([1, 3, 5, 7, 9], drawn), 2, SPEC, max_in_flight=2)
    next(stream)
    assert drawn == [0, 1]  # a consumer that stops here never drew the other prompts
    list(stream)
    assert drawn == [0, 1, 2, 3, 4]


def test_split_groups_keeps_each_groups_rows_and_padding():
    batch = Recorder()([[5], [6, 6]], 3, SPEC)
    groups = split_groups(batch)
    assert [g.batch_size[0] for g in groups] == [3, 3]
    assert all(g["prompt_ids"].shape == (3, 2) for g in groups)  # the batch's prompt width, not its own
    assert (concat_batches(groups, pad_id=0) == batch).all()


def test_the_transformers_engine_streams_what_it_generates(tiny_model_dir):
    engine = TransformersEngine(str(tiny_model_dir), torch.device("cpu"))
    prompts = [[1, 9690, 198, 22], [1, 4093, 198], [1, 22, 23, 24, 25, 26]]
    spec = SamplingSpec(max_new_tokens=6, temperature=0.9, seed=5)
    try:
        whole = engine.generate(prompts, 3, spec)
        reqs = [GroupRequest(key=i, prompt=p, seed=5 + i * 3) for i, p in enumerate(prompts)]
        groups = dict(engine.stream(iter(reqs), 3, spec, max_in_flight=len(prompts)))
    finally:
        engine.shutdown()
    assert sorted(groups) == [0, 1, 2]
    joined = concat_batches([groups[i] for i in range(3)], engine.pad_id)
    for key in ("prompt_ids", "response_ids", "response_mask", "group_id", "truncated", "behavior_logprobs"):
        assert torch.equal(joined[key], whole[key]), key


def simulated(long_tail: float, seconds: float = 0.2):
    from grpo_rl.engines.simulated import SimulatedEngine

    return SimulatedEngine(vocab_size=50, seconds=seconds, jitter=0.0, answer_tokens=40, pad_id=0, long_tail=long_tail)


def test_the_simulated_engine_hands_back_short_groups_before_long_ones_drawn_earlier():
    engine = simulated(long_tail=2.0)
    engine.rng.seed(3)
    reqs = [GroupRequest(key=i, prompt=[1, 2], seed=i) for i in range(6)]
    out = list(engine.stream(iter(reqs), 4, SamplingSpec(max_new_tokens=40), max_in_flight=6))
    longest = [int(rows["response_mask"].sum(-1).max()) for _, rows in out]
    assert sorted(key for key, _ in out) == list(range(6))
    assert longest == sorted(longest) and longest[0] < longest[-1]  # in order of their longest answer
    assert all(rows.batch_size[0] == 4 and set(rows["group_id"].tolist()) == {0} for _, rows in out)


def test_a_push_under_a_simulated_group_stamps_its_later_tokens():
    engine = simulated(long_tail=0.0, seconds=2.0)  # the push lands 0.3 s into a group of 2 s
    stream = engine.stream(iter([GroupRequest(key=0, prompt=[1], seed=0)]), 2, SamplingSpec(max_new_tokens=40), 1)
    timer = threading.Timer(0.3, lambda: engine.update_weights([], version=5))
    timer.start()
    (_, rows), *_ = list(stream)
    timer.join()
    versions = rows["behavior_version"][0].tolist()
    assert versions[0] == 0 and versions[-1] == 5 and versions == sorted(versions)
