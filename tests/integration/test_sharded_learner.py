"""Sharded learner (FSDP2): two CPU ranks (gloo) make the same update as one process on the same batch.

Each rank runs the real :class:`~grpo_rl.training.learner.Learner` on a model sharded by
:func:`~grpo_rl.distributed.sharding.shard_model`, on its shard of the batch; the shards get unequal numbers
of micro-batches, so the learner's padding passes are exercised. Rank 0 writes what it gathered to a file and
the test compares it with a single process training on the whole batch.
"""

from __future__ import annotations

import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_rl.model.loading import load_causal_lm
from grpo_rl.training.learner import Learner, LossSettings
from tests.integration.test_data_parallel import grpo_batch

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CPU = torch.device("cpu")
WORLD_SIZE = 2
GROUP_SIZES = [4, 3, 6]  # shards of 4 and 9 rows: unequal micro-batch counts at 64 tokens each
JOIN_SECONDS = 120


def make_learner(model: torch.nn.Module) -> Learner:
    return Learner(model, CPU, LossSettings(), lr=1e-3, micro_batch_tokens=64)


def sharded_learner(model_dir: Path) -> Learner:
    from grpo_rl.distributed.sharding import ShardedDataParallel, shard_model

    learner = make_learner(shard_model(load_causal_lm(str(model_dir), CPU)))
    learner.data_parallel = ShardedDataParallel()
    return learner


def run_rank(rank: int, model_dir: Path, out_dir: Path) -> None:
    """One rank: 2 steps (full weights after each), then a full-state round trip into a fresh learner, 1 more step."""
    from grpo_rl.distributed.data_parallel import shard_batch
    from grpo_rl.distributed.sharding import (
        full_named_weights,
        full_optimizer_state,
        load_full_model_state,
        load_full_optimizer_state,
    )

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{out_dir / 'rendezvous'}",
            rank=rank,
            world_size=WORLD_SIZE,
            timeout=timedelta(seconds=60),
        )
        learner = sharded_learner(model_dir)
        shard = shard_batch(grpo_batch(GROUP_SIZES, vocab=learner.model.config.vocab_size), WORLD_SIZE)[rank]
        steps = []
        for _ in range(2):
            metrics = learner.train_step(shard.clone())
            steps.append((metrics, full_named_weights(learner.model)))

        model_state = dict(full_named_weights(learner.model))  # empty on rank 1: loading broadcasts rank 0's
        optimizer_state = full_optimizer_state(learner.model, learner.optimizer)
        fresh = sharded_learner(model_dir)
        load_full_model_state(fresh.model, model_state)
        load_full_optimizer_state(fresh.model, fresh.optimizer, optimizer_state)
        fresh.scheduler.load_state_dict(learner.scheduler.state_dict())
        learner.train_step(shard.clone())
        fresh.train_step(shard.clone())
        torch.save(
            {"steps": steps, "next": full_named_weights(learner.model), "fresh_next": full_named_weights(fresh.model)},
            out_dir / f"rank{rank}.pt",
        )
    except BaseException:
        (out_dir / f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(model_dir: Path, out_dir: Path) -> list[dict]:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run_rank, args=(rank, model_dir, out_dir)) for rank in range(WORLD_SIZE)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(JOIN_SECONDS)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    errors = "\n".join(f.read_text() for f in sorted(out_dir.glob("rank*.err")))
    assert all(p.exitcode == 0 for p in procs), f"exit codes {[p.exitcode for p in procs]}\n{errors}"
    return [torch.load(out_dir / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]


def test_two_sharded_ranks_make_the_same_update_as_one(tiny_model_dir, tmp_path):
    ranks = run_ranks(tiny_model_dir, tmp_path)
    single = make_learner(load_causal_lm(str(tiny_model_dir), CPU))
    batch = grpo_batch(GROUP_SIZES, vocab=single.model.config.vocab_size)
    init = {name: w.clone() for name, w in single.named_weights()}

    gathered = [dict(weights) for _, weights in ranks[0]["steps"]]
    assert [(n, w.shape) for n, w in ranks[0]["steps"][0][1]] == [(n, w.shape) for n, w in single.named_weights()]
    assert "lm_head.weight" in gathered[0]
    assert ranks[1]["steps"][0][1] == []  # gathered to rank 0 only
    counts = [r["steps"][0][0]["num_micro_batches"] for r in ranks]
    assert counts[0] != counts[1], counts  # a rank ran padding passes

    max_diff = moved = 0.0
    for step in range(2):
        ms, md = single.train_step(batch.clone()), ranks[0]["steps"][step][0]
        for key in ("loss", "loss_policy", "grad_norm", "clip_fraction", "ratio_mean", "tis_fraction"):
            assert md[key] == pytest.approx(ms[key], rel=1e-5, abs=1e-7), (step, key, ms[key], md[key])
        for name, mine in single.named_weights():
            torch.testing.assert_close(gathered[step][name], mine, rtol=1e-4, atol=1e-5, msg=f"step {step} {name}")
            max_diff = max(max_diff, float((gathered[step][name] - mine).abs().max()))
            moved = max(moved, float((mine - init[name]).abs().max()))
    assert single.version == 2
    assert moved > 100 * max_diff, (moved, max_diff)  # the update is far larger than the difference

    # the learner reloaded from full model + optimizer state makes exactly the same next update
    after, fresh_after = dict(ranks[0]["next"]), dict(ranks[0]["fresh_next"])
    assert after.keys() == gathered[1].keys()
    assert any(not torch.equal(after[n], gathered[1][n]) for n in after)
    for name, w in after.items():
        assert torch.equal(fresh_after[name], w), name
