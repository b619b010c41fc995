"""Asynchronous GRPO on Ray: the collector generates continuously while the learner trains on what it made.

    python sota/grpo-async.py                                  # GSM8K, embedded SmolLM2-135M-Instruct, CPU
    python sota/grpo-async.py pipeline.max_staleness=1 pipeline.push_every=2
    python sota/grpo-async.py ray.address=auto                 # join a running Ray cluster

Same config, factories, loss and learner as sota/grpo.py; only the loop differs. A collector actor (vLLM
engine + environment, built by the same ``make_*`` factories) fills a bounded buffer actor, waiting while it
is full; the learner (this process, or ``train_model.num_devices`` data-parallel ranks) takes the oldest
batch, drops samples older than ``pipeline.max_staleness`` policy versions, scores the rest under the
reference model, trains, and pushes its weights every ``pipeline.push_every`` optimizer steps. The loss's
truncated importance weight (``policy.tis_cap``) corrects the remaining lag; ``staleness_max``,
``dropped_samples``, ``tis_fraction`` and ``ess`` are logged every step.

The reference model runs in the learner's process: on a 2-core machine the collector and the learner
already keep both cores busy, so a reference actor could only time-slice with them, and a LoRA run's
reference is the learner's own model with the adapters off. Ctrl-C or a failed actor stops every actor,
writes a checkpoint at the last step boundary and shuts down the Ray instance this script started.
"""
from __future__ import annotations

import contextlib
import time

import hydra
import torch

from grpo_rl.cli import run_entry, user_errors
from grpo_rl.config import register_configs
from grpo_rl.distributed.pipeline import AsyncRollouts, staleness_metrics, step_rates
from grpo_rl.distributed.ray_setup import cpu_threads_per_worker, start_ray, stop_ray
from grpo_rl.envs import make_env
from grpo_rl.evaluation import make_eval_env
from grpo_rl.factories import make_learner, make_ref_scorer, make_run, seed_everything, train_on_batch
from grpo_rl.lifecycle import GracefulStop, RunState, hydra_run_dir
from grpo_rl.metrics import RunLogger
from grpo_rl.quiet import quiet_start

register_configs()


@hydra.main(config_path="../config", config_name="grpo_gsm8k", version_base="1.3")
@user_errors
def main(cfg) -> float:
    quiet_start()  # drop the known start-up noise of vLLM, torch, transformers and wandb (GRPO_VERBOSE=1 keeps it)
    # Cleanup runs in reverse order of registration, every step even if an earlier one fails: stop the actors
    # (they free the cores and fix the data position), the final checkpoint at the last step boundary, the logs,
    # the learner's ranks, the Ray instance this script started, the signal handlers.
    with contextlib.ExitStack() as cleanup:
        stop = GracefulStop().install()  # Ctrl-C / SIGTERM: finish the step, checkpoint, shut down
        cleanup.callback(stop.restore)
        # Create the run: validate config and run folder, allocate devices, resolve model and precision.
        run = make_run(cfg, hydra_run_dir(cfg), mode="async")
        # Read and check the data here, before Ray and the engines start (the collectors build their own copies).
        make_env(cfg, run.tokenizer, devices=run.devices)
        make_eval_env(run)
        # Every role computes at once: split the cores between the learner rank(s) and the collector(s).
        num_train, num_inference = len(run.devices.train), len(run.devices.inference)
        threads = cpu_threads_per_worker(num_train + num_inference)
        actor_devices = run.devices.inference + (run.devices.train if num_train > 1 else ())

        cleanup.callback(stop_ray, start_ray(cfg.ray, min_cpus=len(actor_devices) * threads, actor_gpus=actor_devices))
        # Create the rollout side (collector actors with their engines, the buffer actor), then the learner.
        rollouts = AsyncRollouts(run, threads=threads)
        cleanup.callback(rollouts.shutdown)
        torch.set_num_threads(threads)
        seed_everything(cfg.seed)
        learner = make_learner(run, threads=threads)
        cleanup.callback(learner.shutdown)
        ref = make_ref_scorer(run, learner)
        rollouts.connect_weights(learner)
        logger = RunLogger.from_config(cfg, run.run_dir)
        cleanup.callback(logger.close)
        state = RunState(cfg, run.run_dir, logger, stop=stop, started=run.started)

        # Resume (resume=auto|<checkpoint>): weights, optimizer, data position, RNG; the engines get the weights.
        state.resume(learner, rollouts.env, rollouts.engine_proxy(learner))
        cleanup.callback(state.finish, learner, rollouts.env, run.tokenizer)
        cleanup.callback(rollouts.shutdown)  # before the checkpoint (a second call later does nothing)
        rollouts.start(state.step)
        prev_stats = rollouts.stats()

        while state.running():  # train.steps, train.max_time_minutes, signals
            t0 = time.perf_counter()
            taken = rollouts.take(learner.version, lambda: state.should_stop() is not None)  # within max_staleness
            if taken is None:
                break
            t1 = time.perf_counter()
            batch, metrics = train_on_batch(run, learner, ref, taken.batch)
            push_seconds = rollouts.maybe_push(learner)  # every pipeline.push_every optimizer steps
            t2 = time.perf_counter()

            stats, step_seconds = rollouts.stats(), t2 - t0
            metrics.update(staleness_metrics(taken))
            metrics.update(step_rates(prev_stats, stats, step_seconds))
            metrics.update(
                policy_version=learner.version, weight_sync_seconds=push_seconds, step_seconds=step_seconds,
                learner_busy_fraction=(t2 - t1) / step_seconds, tokens_per_second=metrics["answer_tokens"] / step_seconds,
                learner_samples_per_second=taken.batch.batch_size[0] / step_seconds,
            )
            if state.should_stop() is None:  # a stop skips the evaluation
                metrics.update(rollouts.maybe_evaluate(learner, state.step + 1, cfg.train.steps))  # eval.every steps
            prev_stats = stats
            state.record_step(learner, rollouts.env, run.tokenizer, metrics, batch,
                              console_suffix=f" | stale {metrics['staleness_mean']:.1f}/{metrics['staleness_max']}"
                              f" | drop {metrics['dropped_samples']} | wait {metrics['learner_wait_seconds']:.1f}s")
    print(state.summary(), flush=True)
    return state.result()


if __name__ == "__main__":
    run_entry(main)
