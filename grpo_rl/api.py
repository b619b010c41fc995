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

A model held in memory trains too: ``Trainer(model=model, tokenizer=tokenizer, ref_model=..., reward_model=...)``
takes ``transformers`` (and ``peft``) objects, as TRL's ``GRPOTrainer`` does. They are written once into the run
folder (the engines and a resumed run load folders) and the trained weights are loaded back into ``model`` at the
end (:mod:`grpo_rl.run.model_objects`; ``examples/notebook_model_objects.py``).

Prompts given as objects are written to ``<run_dir>/prompts.jsonl`` and read back as ``env.dataset=file`` (so the
run folder holds its data, and a resumed run reads the same rows). Reward functions travel with the run context:
the environments of the collector actors (``mode="async"``) get them pickled by value, as Ray pickles any
function. A user error (a bad override, a reward whose signature matches no convention, a missing column) raises
:class:`~grpo_rl.errors.UserError` with the one-line message the scripts print.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from grpo_rl.envs.rewards.custom import RewardFunction

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
        cfg: the run config (composed and typed against :class:`~grpo_rl.config.schema.GRPOConfig`).
        run_dir: the run folder.
        mode: ``sync`` or ``async``.
        rewards: reward functions given as Python objects, added to the configured ones.
    """
    if mode not in ("sync", "async"):
        raise ValueError(f"mode={mode!r}: choose sync or async")
    from grpo_rl.quiet import quiet_start

    quiet_start()  # drop the known start-up noise of vLLM, torch, transformers and wandb (GRPO_VERBOSE=1 keeps it)
    from grpo_rl.run.loop import train as run_loop

    outcome = run_loop(cfg, Path(run_dir), mode, tuple(rewards))
    print(outcome.summary, flush=True)
    return RunResult(
        run_dir=Path(outcome.run_dir),
        steps=outcome.steps,
        final_reward=outcome.final_reward,
        stopped_because=outcome.stopped_because,
        summary=outcome.summary,
    )


def compose(
    config: str | Mapping | None = None, overrides: Iterable[str] = (), *, config_dir: str | Path | None = None
):
    """The run config: a YAML of ``config_dir`` (default ``config/``) by name, or a mapping merged over the schema's
    defaults, then Hydra ``overrides`` (``"train.steps=20"``), checked against the schema as on the command line.

    Raises:
        ConfigError: an override names a key the schema does not have (with the nearest valid names), a value
            does not fit its key's type, or one contradicts a TorchRL key (:mod:`grpo_rl.config.torchrl_keys`, whose
            settings are set here).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from grpo_rl.cli.entry import check_overrides
    from grpo_rl.config.schema import GRPOConfig, register_configs
    from grpo_rl.config.torchrl_keys import override_keys, resolve_torchrl_keys
    from grpo_rl.errors import ConfigError

    overrides = [str(o) for o in overrides]
    check_overrides(overrides)
    register_configs()
    try:
        if config is None or isinstance(config, str):
            folder = Path(config_dir or CONFIG_DIR).resolve()
            if not folder.is_dir():
                raise ConfigError(
                    f"config_dir={folder} does not exist; pass config_dir=<folder of the YAML configs> "
                    "or config=<a dict of settings>"
                )
            with initialize_config_dir(config_dir=str(folder), version_base="1.3"):
                cfg = hydra_compose(config or "grpo_gsm8k", overrides=overrides)
        else:
            cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), OmegaConf.create(dict(config)))
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"the config cannot be composed: {str(e).splitlines()[0]}") from e
    resolve_torchrl_keys(cfg, override_keys(overrides))  # an override that TorchRL's key contradicts is an error
    return cfg


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
            from grpo_rl.errors import ConfigError

            raise ConfigError(
                f"rewards[{i}] is a {type(r).__name__}, not a function; pass functions, "
                "{label: (function, weight)}, or RewardFunction objects"
            )
    return tuple(out)


def prompt_rows(prompts, prompt_column: str = "prompt") -> list[dict]:
    """``prompts`` as data rows: strings become ``{prompt_column: text}``; mappings (rows with a ground truth and
    any other columns) are kept; a ``datasets.Dataset`` gives its rows."""
    from grpo_rl.errors import ConfigError

    if hasattr(prompts, "to_list"):  # datasets.Dataset
        prompts = prompts.to_list()
    rows = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            rows.append({prompt_column: p})
        elif isinstance(p, Mapping):
            rows.append(dict(p))
        else:
            raise ConfigError(
                f"prompts[{i}] is a {type(p).__name__}; give strings, or rows such as "
                f"{{{prompt_column!r}: ..., 'ground_truth': ...}}"
            )
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
        model: the policy as an object held in memory (a ``transformers`` causal LM, or a ``peft`` LoRA model, whose
            adapter shape the run takes), or a folder path; None: ``model.name``.
        tokenizer: the policy's tokenizer; None: the one in the folder ``model`` was loaded from.
        ref_model: a reference model other than the policy's initial weights (an object or a folder), as TRL's
            ``ref_model``; None: the initial weights.
        reward_model: a sequence-classification reward model (``num_labels=1``; an object or a folder), scored as
            ``reward.model_path``.
        reward_tokenizer: the reward model's tokenizer; None: the one in its folder.

    The config is composed and checked here (:attr:`cfg`; each :meth:`train` runs on a copy, which the run makes
    read-only); the reward functions' signatures and the data are checked when :meth:`train` starts, before any
    engine. Model objects are written once into the run folder, where they stay as the run's models
    (:mod:`grpo_rl.run.model_objects`), and after training the final weights are loaded back into a plain ``model``
    object, in place (a ``peft`` model is left as it was: the trained model is ``result.final_model``).
    """

    def __init__(
        self,
        config: str | Mapping | None = None,
        *,
        overrides: Iterable[str] = (),
        prompts=None,
        rewards: Callable | Sequence | Mapping | None = None,
        run_dir: str | Path | None = None,
        mode: str = "sync",
        config_dir: str | Path | None = None,
        model=None,
        tokenizer=None,
        ref_model=None,
        reward_model=None,
        reward_tokenizer=None,
    ):
        if mode not in ("sync", "async"):
            raise ValueError(f"mode={mode!r}: choose sync or async")
        from grpo_rl.run.model_objects import ModelObjects

        self.cfg = compose(config, overrides, config_dir=config_dir)
        self.models = ModelObjects(
            model=model,
            tokenizer=tokenizer,
            ref_model=ref_model,
            reward_model=reward_model,
            reward_tokenizer=reward_tokenizer,
        )
        self.models.check()
        self.rewards = reward_functions(rewards)
        self.prompts = None if prompts is None else prompt_rows(prompts, self.cfg.env.prompt_column)
        self.mode = mode
        if run_dir is None:
            run_dir = self.cfg.output_dir or Path("outputs") / time.strftime("%Y-%m-%d/%H-%M-%S")
        self.run_dir = Path(run_dir).expanduser().resolve()

    def train(self) -> RunResult:
        """Run to ``train.steps`` (or the time limit, or Ctrl-C: the last completed step is checkpointed)."""
        from grpo_rl.quiet import quiet_start
        from grpo_rl.run.lifecycle import check_output_dir
        from grpo_rl.run.model_objects import copy_trained_weights, write_model_objects

        quiet_start()  # before the models are written (transformers' progress bars)
        cfg = copy.deepcopy(self.cfg)  # a run makes its config read-only: self.cfg stays editable for another run
        check_output_dir(self.run_dir)  # before the folder is made for the prompts or the models
        write_model_objects(cfg, self.run_dir, self.models)
        if self.prompts is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            data = self.run_dir / "prompts.jsonl"
            data.write_text("".join(json.dumps(row, default=str) + "\n" for row in self.prompts))
            cfg.env.dataset, cfg.env.path = "file", str(data)
            gt = cfg.env.ground_truth_column
            if gt is not None and not any(gt in row for row in self.prompts):
                cfg.env.ground_truth_column = None  # prompts without references: the rewards get None for each
        result = train(cfg, self.run_dir, mode=self.mode, rewards=self.rewards)
        model = self.models.model
        if model is not None and not isinstance(model, (str, Path)):
            copy_trained_weights(result.final_model, model)
        return result


__all__ = ["RunResult", "Trainer", "compose", "train"]
