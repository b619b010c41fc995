"""Asynchronous GRPO on Ray: the collectors generate continuously while the learner trains on what they made.

    python sota/grpo-async.py                                  # GSM8K, embedded SmolLM2-135M-Instruct, CPU
    python sota/grpo-async.py pipeline.max_staleness=1 pipeline.push_every=2
    python sota/grpo-async.py ray.address=auto                 # join a running Ray cluster

Same config, roles, loss and learner as sota/grpo.py; the rollout source, the weight sync and the loop differ.
Collector actors (one per inference device, each an engine + environment built by the same factories) fill a
bounded buffer, waiting while it is full; with the reference on devices of its own (``ref_model.placement``) its
actors score the next batch while the learner trains. The learner (this process, or ``train_model.num_devices``
ranks) takes the oldest batch, drops whole groups older than ``pipeline.max_staleness`` policy versions, trains,
and pushes its weights every ``pipeline.push_every`` optimizer steps. The loss's truncated importance weight
(``policy.tis_cap``) corrects the remaining lag; ``staleness_max``, ``dropped_samples``, ``tis_fraction`` and
``ess`` are logged every step. A resumed run trains on every drawn batch exactly once (trained.jsonl).

Ctrl-C, a failed or silent role (``pipeline.timeout_seconds``) stops every actor, writes a checkpoint at the last
step boundary and shuts down the Ray instance this script started.
"""
from __future__ import annotations

import contextlib
import time

import hydra

from grpo_rl.cli import run_entry, user_errors
from grpo_rl.config import register_configs
from grpo_rl.envs import make_env
from grpo_rl.evaluation import due_for_evaluation, make_eval_env
from grpo_rl.factories import make_run, seed_everything, train_on_batch
from grpo_rl.lifecycle import GracefulStop, RunState, hydra_run_dir
from grpo_rl.metrics import RunLogger
from grpo_rl.quiet import quiet_start
from grpo_rl.roles import make_learner, make_reference, make_rollout_source, make_weight_sync, start_roles

register_configs()


@hydra.main(config_path="../config", config_name="grpo_gsm8k", version_base="1.3")
@user_errors
def main(cfg) -> float:
    quiet_start()  # drop the known start-up noise of vLLM, torch, transformers and wandb (GRPO_VERBOSE=1 keeps it)
    # Cleanup runs in reverse order of registration, every step even if an earlier one fails: stop the actors
    # (they free the cores), the final checkpoint at the last step boundary, the logs, the learner's ranks, the Ray
    # instance this script started, the signal handlers.
    with contextlib.ExitStack() as cleanup:
        stop = GracefulStop().install()  # Ctrl-C / SIGTERM: finish the step, checkpoint, shut down
        cleanup.callback(stop.restore)
        # Create the run: validate config and run folder, allocate devices, place the roles, resolve precision.
        run = make_run(cfg, hydra_run_dir(cfg), mode="async")
        # Read and check the data here, before Ray and the engines start (the collectors build their own copies;
        # this one tracks the stream position).
        env = make_env(cfg, run.tokenizer, devices=run.devices)
        make_eval_env(run)

        # Create the roles: collector actors with their engines and the buffer, the reference, the learner.
        start_roles(run, cleanup)
        source, ref = make_rollout_source(run, env, reference=make_reference(run))
        cleanup.callback(source.close)
        seed_everything(cfg.seed)
        learner = make_learner(run)
        cleanup.callback(learner.shutdown)
        weight_sync = make_weight_sync(run, rollouts=source)
        cleanup.callback(weight_sync.close)
        logger = RunLogger.from_config(cfg, run.run_dir)
        cleanup.callback(logger.close)
        state = RunState(cfg, run.run_dir, logger, stop=stop, started=run.started)

        # Resume (resume=auto|<checkpoint>): weights, optimizer, stream position, RNG; the engines get the weights.
        state.resume(learner, source, weight_sync)
        cleanup.callback(state.finish, learner, source, run.tokenizer)
        cleanup.callback(source.close)  # before the checkpoint (a second call later does nothing)
        pushed = learner.version  # the version the engines hold

        while state.running():  # train.steps, train.max_time_minutes, signals
            t0 = time.perf_counter()
            rollout = source.next_batch(learner.version, lambda: state.should_stop() is not None)
            if rollout is None:
                break
            t1 = time.perf_counter()
            batch, metrics = train_on_batch(run, learner, ref, rollout.batch)
            step, push_seconds = state.step + 1, 0.0
            evaluate = state.should_stop() is None and due_for_evaluation(cfg.eval.every, step, cfg.train.steps)
            if learner.version - pushed >= cfg.pipeline.push_every or (evaluate and learner.version != pushed):
                push_seconds, pushed = weight_sync.push(learner.weights_for_push(), learner.version), learner.version
            t2 = time.perf_counter()

            step_seconds = t2 - t0
            metrics.update(rollout.metrics)
            metrics.update(
                policy_version=learner.version, weight_sync_seconds=push_seconds, step_seconds=step_seconds,
                learner_busy_fraction=(t2 - t1) / step_seconds, tokens_per_second=metrics["answer_tokens"] / step_seconds,
                learner_samples_per_second=rollout.batch.batch_size[0] / step_seconds,
            )
            if evaluate:  # held-out evaluation by the first collector's engine, with the weights just pushed
                metrics.update(source.evaluate(step, cfg.train.steps))
            state.record_step(learner, source, run.tokenizer, metrics, batch, rollout.failure_examples,
                              console_suffix=f" | stale {metrics['staleness_mean']:.1f}/{metrics['staleness_max']}"
                              f" | drop {metrics['dropped_samples']} | wait {metrics['learner_wait_seconds']:.1f}s")
    print(state.summary(), flush=True)
    return state.result()


if __name__ == "__main__":
    run_entry(main)
