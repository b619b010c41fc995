"""Evaluate a checkpoint, a run folder or an HF model folder on held-out prompts, from the command line:

python -m grpo_rl.cli.evaluate checkpoint=<dir> [--config-name NAME] [key=value ...]
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path

import torch

from grpo_rl.cli.entry import CONFIG_DIR, USER_ERROR_EXIT, report_user_error
from grpo_rl.errors import UserError
from grpo_rl.rollout.evaluation import eval_split, make_evaluator

log = logging.getLogger(__name__)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, an HF model folder, or a run folder (its newest intact checkpoint, else its final
    model); a checkpoint is checked against its manifest here, before anything of it is loaded.

    Raises:
        CheckpointNotFoundError: ``path`` is none of these.
        CheckpointDamagedError: the checkpoint named is damaged, or every checkpoint of the run folder is.
    """
    from grpo_rl.run.checkpoint import (
        CheckpointDamagedError,
        Checkpointer,
        CheckpointNotFoundError,
        verify_checkpoint,
    )

    path = Path(path).expanduser().resolve()
    try:
        if (path / "trainer_state.pt").exists():
            verify_checkpoint(path)
            return path
        if (path / "config.json").exists():
            return path  # an HF folder: its files are checked with every model folder (grpo_rl.run.setup)
        latest = Checkpointer(path).latest_intact()
    except CheckpointDamagedError as e:
        raise CheckpointDamagedError(f"checkpoint={path}: {e}") from None
    if latest is not None:
        return latest
    if (path / "final_model" / "config.json").exists():
        return path / "final_model"
    raise CheckpointNotFoundError(
        f"checkpoint={path}: not a checkpoint folder, an HF model folder, or a run folder; "
        "pass <run dir>/checkpoints/step_NNNNNNNN, <run dir>/final_model or <run dir>"
    )


def _saved_config(path: Path):
    """The run config stored with a checkpoint (its config.yaml), or with the run a final model came from."""
    from omegaconf import OmegaConf

    from grpo_rl.run.checkpoint import Checkpointer

    candidates = [path / "config.yaml"]
    if path.name == "final_model":  # <run_dir>/final_model: the run's newest checkpoint knows the config
        latest = Checkpointer(path.parent).latest()
        candidates += [latest / "config.yaml"] if latest is not None else []
        candidates.append(path.parent / ".hydra" / "config.yaml")
    for candidate in candidates:
        if candidate.exists():
            return OmegaConf.load(candidate)
    return None


def materialize_model(path: Path, cfg, out_dir: Path) -> Path:
    """An HF folder with the weights at ``path``: itself, its ``model/``, or its LoRA adapter merged onto the base."""
    if (path / "config.json").exists():
        return path
    if (path / "model" / "config.json").exists():
        return path / "model"
    from grpo_rl.model.loading import load_causal_lm, load_tokenizer, resolve_model
    from grpo_rl.model.lora import ADAPTER_DIR, apply_lora, load_adapter
    from grpo_rl.run.checkpoint import export_model

    if not (path / ADAPTER_DIR).exists():
        raise FileNotFoundError(f"{path}: holds neither model/ nor {ADAPTER_DIR}/")
    base = resolve_model(cfg.model.name, cfg.model.cache_dir)
    lora = cfg.model.lora
    model = apply_lora(
        load_causal_lm(base, torch.device("cpu"), cfg.model.dtype, trainable=False),
        r=lora.r,
        alpha=lora.alpha,
        dropout=lora.dropout,
        target_modules=lora.target_modules,
    )
    load_adapter(model, path / ADAPTER_DIR)
    log.info("merging the LoRA adapter of %s onto %s into %s", path, base, out_dir)
    return export_model(model, load_tokenizer(base), out_dir)


def compose_config(argv: list[str]):
    """``(checkpoint path, config)`` from ``checkpoint=...``, ``--config-name NAME`` and ``key=value`` overrides:
    the schema with the named YAML, then the checkpoint's saved run config, then the overrides."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from grpo_rl.config.schema import register_configs

    checkpoint, config_name, overrides = None, "grpo_gsm8k", []
    args = iter(argv)
    for arg in args:
        if arg.startswith("checkpoint="):
            checkpoint = arg.split("=", 1)[1]
        elif arg == "--config-name":
            config_name = next(args)
        elif arg.startswith("--config-name="):
            config_name = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    if checkpoint is None:
        raise SystemExit("usage: python -m grpo_rl.cli.evaluate checkpoint=<dir> [--config-name NAME] [key=value ...]")
    path = resolve_checkpoint(checkpoint)
    register_configs()
    config_dir = CONFIG_DIR
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose(config_name=config_name)
    saved = _saved_config(path)
    if saved is not None:
        saved.pop("hydra", None)
        cfg = OmegaConf.merge(cfg, saved)
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    return path, cfg


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Evaluate a checkpoint; print the metrics and write them to ``<checkpoint>/eval_results.json``."""
    from grpo_rl.engines.build import make_engine
    from grpo_rl.run.setup import make_run

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    path, cfg = compose_config(list(sys.argv[1:] if argv is None else argv))
    with tempfile.TemporaryDirectory(prefix="grpo-eval-") as tmp:
        cfg.model.name = str(materialize_model(path, cfg, Path(tmp) / "merged"))
        cfg.resume = None
        cfg.train.prompt_epochs = None  # the saved train.steps is final: the training prompts need not be counted
        run = make_run(cfg, Path(tmp) / "run")  # sets this process's threads
        engine = make_engine(run)
        try:
            metrics = make_evaluator(run, engine, every=1).evaluate()
        finally:
            engine.shutdown()
    out = path / "eval_results.json" if path.is_dir() else Path("eval_results.json")
    result = {"checkpoint": str(path), "split": eval_split(cfg), **metrics}
    try:
        out.write_text(json.dumps(result, indent=2) + "\n")
    except OSError as e:  # a read-only checkpoint folder: the printed table is the result
        log.warning("could not write %s (%s)", out, e)
    width = max(len(k) for k in result)
    print(
        "\n".join(
            f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}" for k, v in result.items()
        ),
        flush=True,
    )
    return metrics


def cli() -> None:
    """``python -m grpo_rl.cli.evaluate``: :func:`main`, with a mistake in the input (a damaged checkpoint, a bad
    setting) printed as one line and exit status 2, as the training scripts do."""
    try:
        main()
    except UserError as e:
        report_user_error(e)
        sys.exit(USER_ERROR_EXIT)


if __name__ == "__main__":
    cli()
