"""Train from Python (a notebook, a script of your own): the run ``sota/grpo.py`` and ``sota/grpo-async.py`` make,
with prompts and reward functions given as Python objects.

    from grpo_rl import Trainer

    def exact(responses, references):                 # ours; functions written for verl or TRL work as they are
        return [float(ref in r) for r, ref in zip(responses, references)]

    trainer = Trainer(
        prompts=[{"prompt": "What is 17 + 25?", "ground_truth": "42"}, ...],  # or strings, or a datasets.Dataset
        rewards=exact,                                # or a list of them, or {label: (function, weight)}
        overrides=["train.steps=20", "sampling.max_new_tokens=64"],
    )
    result = trainer.train()                          # progress on the console, as the scripts print it
    result.metrics[-1]["reward_mean"], result.final_model

Everything else is the scripts' run: the config (``config/grpo_gsm8k.yaml`` and any overrides, checked against the
schema with the same messages), the run folder (``output_dir``, else ``outputs/DATE/TIME``) with its logs,
checkpoints, ``resume`` and the exported final model. Both scripts are thin users of :func:`train`, so a run made
here and one made from the command line with the same config are the same run.

Prompts given as objects are written to ``<run_dir>/prompts.jsonl`` and read back as ``env.dataset=file`` (so the
run folder holds its data, and a resumed run reads the same rows). Reward functions travel with the run context:
the environments of the collector actors (``mode="async"``) get them pickled by value, as Ray pickles any
function. A user error (a bad override, a reward whose signature matches no convention, a missing column) raises
:class:`~grpo_rl.errors.UserError` with the one-line message the scripts print.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from grpo_rl.errors import RoleFailed
from grpo_rl.rewards.custom import RewardFunction

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"


@dataclass
class RunResult:
    """What a finished (or stopped) run leaves.

    Attributes:
        run_dir: the run folder.
        steps: steps completed (counting those of the run this one resumed).
        final_reward: the last step's mean reward (NaN before the first step): what a ``--multirun`` sweep compares.
        stopped_because: why the run stopped before ``train.steps`` (a signal, the time limit), or None.
        summary: the lines the scripts print at the end.
    """

    run_dir: Path
    steps: int
    final_reward: float
    stopped_because: str | None
    summary: str

    @property
    def metrics(self) -> list[dict]:
        """One record per step (and per evaluation), as in ``metrics.jsonl``."""
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    @property
    def final_model(self) -> Path:
        """The exported HF folder of the final weights (``<run_dir>/final_model``)."""
        return self.run_dir / "final_model"


def train(cfg, run_dir: str | Path, *, mode: str = "sync", rewards: Sequence[RewardFunction] = ()) -> RunResult:
    """Run GRPO as configured: ``mode="sync"`` is ``sota/grpo.py``'s loop, ``"async"`` ``sota/grpo-async.py``'s.

    Args:
        cfg: the run config (composed and typed against :class:`~grpo_rl.config.GRPOConfig`).
        run_dir: the run folder.
        mode: ``sync`` or ``async``.
        rewards: reward functions given as Python objects, added to the configured ones.
    """
    if mode not in ("sync", "async"):
        raise ValueError(f"mode={mode!r}: choose sync or async")
    from grpo_rl.quiet import quiet_start

    quiet_start()  # drop the known start-up noise of vLLM, torch, transformers and wandb (GRPO_VERBOSE=1 keeps it)
    loop = _train_sync if mode == "sync" else _train_async
    state = loop(cfg, Path(run_dir), tuple(rewards))
    summary = state.summary()
    print(summary, flush=True)
    return RunResult(run_dir=Path(state.run_dir), steps=state.step, final_reward=state.result(),
                     stopped_because=state.stopped_because, summary=summary)


def _train_sync(cfg, run_dir: Path, rewards: tuple):
    """Collect a batch with the current weights, train on it, push the weights, repeat (policy lag zero)."""
    from grpo_rl.evaluation import make_eval_env, make_evaluator
    from grpo_rl.factories import make_engine, make_run, make_train_env, seed_everything, train_on_batch
    from grpo_rl.lifecycle import GracefulStop, RunState, StopRun
    from grpo_rl.metrics import RunLogger
    from grpo_rl.roles import make_learner, make_reference, make_rollout_source, make_weight_sync, start_roles

    # Cleanup runs in reverse order of registration, every step even if an earlier one fails: the final
    # checkpoint and export (of the last completed step), the logs, the roles, Ray, the signal handlers.
    with contextlib.ExitStack() as cleanup:
        stop = GracefulStop().install()  # Ctrl-C / SIGTERM: stop at the next phase, checkpoint, exit
        cleanup.callback(stop.restore)
        # Create the run: validate config and run folder, allocate devices, place the roles, resolve precision.
        run = make_run(cfg, run_dir, rewards=rewards)
        # Read and check the data before any engine starts.
        env = make_train_env(run)
        eval_env = make_eval_env(run)

        # Create the engine first: in-process vLLM seeds the global RNGs, so we seed after it. An engine that
        # shares the learner's model (inference_model.share_weights) comes after the learner instead.
        start_roles(run, cleanup)
        shared = cfg.inference_model.share_weights
        engine = None if shared else make_engine(run)
        seed_everything(cfg.seed)
        learner = make_learner(run)
        cleanup.callback(learner.shutdown)
        if shared:
            engine = make_engine(run, policy=learner.model)
        cleanup.callback(engine.shutdown)
        source, ref = make_rollout_source(run, env, engine=engine, reference=make_reference(run, learner))
        weight_sync = make_weight_sync(run, engine=engine)
        evaluator = make_evaluator(run, engine, env=eval_env)
        logger = RunLogger.from_config(cfg, run.run_dir)
        cleanup.callback(logger.close)
        state = RunState(cfg, run.run_dir, logger, stop=stop, started=run.started)

        # Resume (resume=auto|<checkpoint>): weights, optimizer, stream position, RNG; the engine gets the weights.
        state.resume(learner, source, weight_sync)
        cleanup.callback(state.finish, learner, source, run.tokenizer)

        try:
            while state.running():  # train.steps, train.max_time_minutes, signals
                t0 = time.perf_counter()
                rollout = source.next_batch(learner.version)
                state.between_phases("generation")  # before the update, a stop abandons the step
                version = learner.version
                batch, metrics = train_on_batch(run, learner, ref, rollout.batch, between_phases=state.between_phases)
                t1 = time.perf_counter()
                # Nothing to push after a filtered-out batch or a skipped update, or to an engine that shares the model.
                if learner.version != version and not shared:
                    weight_sync.push(learner.weights_for_push(), learner.version)
                t2 = time.perf_counter()

                metrics.update(rollout.metrics)
                metrics.update(policy_version=learner.version, weight_sync_seconds=t2 - t1, step_seconds=t2 - t0,
                               tokens_per_second=metrics["answer_tokens"] / (t2 - t0))
                if evaluator is not None and state.should_stop() is None:  # a stop skips the evaluation
                    metrics.update(evaluator.maybe_evaluate(state.step + 1, cfg.train.steps))
                state.record_step(learner, source, run.tokenizer, metrics, batch, rollout.failure_examples)
        except StopRun as e:
            print(f"stopping: {e}", flush=True)
    return state


def _train_async(cfg, run_dir: Path, rewards: tuple):
    """Collector actors generate continuously into a bounded buffer while the learner trains on what they made."""
    from grpo_rl.evaluation import due_for_evaluation, make_eval_env
    from grpo_rl.factories import make_run, make_train_env, seed_everything, train_on_batch
    from grpo_rl.lifecycle import GracefulStop, RunState
    from grpo_rl.metrics import RunLogger
    from grpo_rl.roles import make_learner, make_reference, make_rollout_source, make_weight_sync, start_roles

    # Cleanup runs in reverse order of registration, every step even if an earlier one fails: stop the actors
    # (they free the cores), the final checkpoint at the last step boundary, the logs, the learner's ranks, the Ray
    # instance this run started, the signal handlers.
    with contextlib.ExitStack() as cleanup:
        stop = GracefulStop().install()  # Ctrl-C / SIGTERM: finish the step, checkpoint, shut down
        cleanup.callback(stop.restore)
        # Create the run: validate config and run folder, allocate devices, place the roles, resolve precision.
        run = make_run(cfg, run_dir, mode="async", rewards=rewards)
        # Read and check the data here, before Ray and the engines start (the collectors build their own copies;
        # this one tracks the stream position).
        env = make_train_env(run)
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
            push_failed = None  # the step is trained: it is logged and checkpointed before the failure ends the run
            try:
                if learner.version - pushed >= cfg.pipeline.push_every or (evaluate and learner.version != pushed):
                    push_seconds, pushed = weight_sync.push(learner.weights_for_push(), learner.version), learner.version
                if evaluate:  # the collectors are threaded: the push must have landed before the evaluation call
                    push_seconds += weight_sync.delivered()
            except RoleFailed as e:
                push_failed, evaluate = e, False
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
            if push_failed is not None:
                raise push_failed
    return state


def compose(config: str | Mapping | None = None, overrides: Iterable[str] = (), *,
            config_dir: str | Path | None = None):
    """The run config: a YAML of ``config_dir`` (default ``config/``) by name, or a mapping merged over the schema's
    defaults, then Hydra ``overrides`` (``"train.steps=20"``), checked against the schema as on the command line.

    Raises:
        ConfigError: an override names a key the schema does not have (with the nearest valid names), or a value
            does not fit its key's type.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from grpo_rl.cli import check_overrides
    from grpo_rl.config import ConfigError, GRPOConfig, register_configs

    overrides = [str(o) for o in overrides]
    check_overrides(overrides)
    register_configs()
    try:
        if config is None or isinstance(config, str):
            folder = Path(config_dir or CONFIG_DIR).resolve()
            if not folder.is_dir():
                raise ConfigError(f"config_dir={folder} does not exist; pass config_dir=<folder of the YAML configs> "
                                  "or config=<a dict of settings>")
            with initialize_config_dir(config_dir=str(folder), version_base="1.3"):
                return hydra_compose(config or "grpo_gsm8k", overrides=overrides)
        cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), OmegaConf.create(dict(config)))
        return OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"the config cannot be composed: {str(e).splitlines()[0]}") from e


def reward_functions(rewards) -> tuple[RewardFunction, ...]:
    """``rewards`` as :class:`RewardFunction` objects: one callable, a list of callables (weight 1), a mapping
    ``{label: callable or (callable, weight)}``, or RewardFunction objects."""
    if rewards is None:
        return ()
    if callable(rewards) or isinstance(rewards, RewardFunction):
        rewards = [rewards]
    if isinstance(rewards, Mapping):
        out = []
        for label, value in rewards.items():
            fn, weight = value if isinstance(value, tuple) else (value, 1.0)
            out.append(RewardFunction(fn, float(weight), str(label)))
        return tuple(out)
    out = []
    for i, r in enumerate(rewards):
        if isinstance(r, RewardFunction):
            out.append(r)
        elif callable(r):
            out.append(RewardFunction(r))
        else:
            from grpo_rl.config import ConfigError

            raise ConfigError(f"rewards[{i}] is a {type(r).__name__}, not a function; pass functions, "
                              "{label: (function, weight)}, or RewardFunction objects")
    return tuple(out)


def prompt_rows(prompts, prompt_column: str = "prompt") -> list[dict]:
    """``prompts`` as data rows: strings become ``{prompt_column: text}``; mappings (rows with a ground truth and
    any other columns) are kept; a ``datasets.Dataset`` gives its rows."""
    from grpo_rl.config import ConfigError

    if hasattr(prompts, "to_list"):  # datasets.Dataset
        prompts = prompts.to_list()
    rows = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            rows.append({prompt_column: p})
        elif isinstance(p, Mapping):
            rows.append(dict(p))
        else:
            raise ConfigError(f"prompts[{i}] is a {type(p).__name__}; give strings, or rows such as "
                              f"{{{prompt_column!r}: ..., 'ground_truth': ...}}")
    if not rows:
        raise ConfigError("prompts is empty; give at least env.prompts_per_step prompts")
    return rows


class Trainer:
    """A GRPO run built from Python objects; :meth:`train` runs it.

    Args:
        config: a YAML name in ``config_dir`` (default ``grpo_gsm8k``), or a mapping of settings merged over the
            schema's defaults.
        overrides: Hydra overrides, as on the command line: ``["train.steps=20", "optimizer.lr=1e-5"]``.
        prompts: the training prompts: strings, rows (mappings with ``env.prompt_column`` and, when the reward
            uses references, ``env.ground_truth_column``), or a ``datasets.Dataset``. None: the config's task.
        rewards: reward functions (ours, verl's or TRL's convention, recognised by signature): a callable, a list,
            or ``{label: (function, weight)}``; added to the config's rewards.
        run_dir: the run folder; default ``output_dir`` if set, else ``outputs/DATE/TIME``.
        mode: ``sync`` (``sota/grpo.py``'s loop) or ``async`` (``sota/grpo-async.py``'s).
        config_dir: where YAML configs are found.

    The config is composed and checked here (:attr:`cfg`, editable before :meth:`train`); the reward functions'
    signatures and the data are checked when :meth:`train` starts, before any engine.
    """

    def __init__(self, config: str | Mapping | None = None, *, overrides: Iterable[str] = (), prompts=None,
                 rewards: Callable | Sequence | Mapping | None = None, run_dir: str | Path | None = None,
                 mode: str = "sync", config_dir: str | Path | None = None):
        if mode not in ("sync", "async"):
            raise ValueError(f"mode={mode!r}: choose sync or async")
        self.cfg = compose(config, overrides, config_dir=config_dir)
        self.rewards = reward_functions(rewards)
        self.prompts = None if prompts is None else prompt_rows(prompts, self.cfg.env.prompt_column)
        self.mode = mode
        if run_dir is None:
            run_dir = self.cfg.output_dir or Path("outputs") / time.strftime("%Y-%m-%d/%H-%M-%S")
        self.run_dir = Path(run_dir).expanduser().resolve()

    def train(self) -> RunResult:
        """Run to ``train.steps`` (or the time limit, or Ctrl-C: the last completed step is checkpointed)."""
        cfg = self.cfg
        if self.prompts is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            data = self.run_dir / "prompts.jsonl"
            data.write_text("".join(json.dumps(row, default=str) + "\n" for row in self.prompts))
            cfg.env.dataset, cfg.env.path = "file", str(data)
            gt = cfg.env.ground_truth_column
            if gt is not None and not any(gt in row for row in self.prompts):
                cfg.env.ground_truth_column = None  # prompts without references: the rewards get None for each
        return train(cfg, self.run_dir, mode=self.mode, rewards=self.rewards)


__all__ = ["RunResult", "Trainer", "compose", "train"]
