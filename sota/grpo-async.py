"""Asynchronous GRPO on Ray: the collectors generate continuously while the learner trains on what they made.

    python sota/grpo-async.py                                  # GSM8K, embedded SmolLM2-135M-Instruct, CPU
    python sota/grpo-async.py pipeline.max_staleness=1 pipeline.push_every=2
    python sota/grpo-async.py ray.address=auto                 # join a running Ray cluster

Same config, roles, loss, learner and loop as sota/grpo.py; the rollout source, the weight sync and the push policy
differ.
Collector actors (one per inference device, each an engine + environment built by the same factories) fill a
bounded buffer, waiting while it is full; with the reference on devices of its own (``ref_model.placement``) its
actors score the next batch while the learner trains. The learner (this process, or ``train_model.num_devices``
ranks) takes the oldest batch, drops whole groups older than ``pipeline.max_staleness`` policy versions, trains,
and pushes its weights every ``pipeline.push_every`` optimizer steps. The loss's truncated importance weight
(``policy.tis_cap``) corrects the remaining lag; ``staleness_max``, ``dropped_samples``, ``tis_fraction`` and
``ess`` are logged every step. A resumed run trains on every drawn batch exactly once (trained.jsonl).

Ctrl-C, a failed or silent role (``pipeline.timeout_seconds``) stops every actor, writes a checkpoint at the last
step boundary and shuts down the Ray instance this script started.

The loop itself is in grpo_rl/run/loop.py, shared with the Python API (``grpo_rl.Trainer``); this script gives it
Hydra's config, overrides and run folder.
"""

from __future__ import annotations

import hydra

from grpo_rl.api import train
from grpo_rl.cli.entry import hydra_run_dir, run_entry, user_errors
from grpo_rl.config.schema import register_configs

register_configs()


@hydra.main(config_path="../config", config_name="grpo_gsm8k", version_base="1.3")
@user_errors
def main(cfg) -> float:
    return train(cfg, hydra_run_dir(cfg), mode="async").final_reward  # the loop: grpo_rl/run/loop.py


if __name__ == "__main__":
    run_entry(main)
