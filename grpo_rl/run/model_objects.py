"""Models given as Python objects (the Python API's ``model=``, ``ref_model=``, ``reward_model=``).

Every role loads its model from a folder (engines, actors on other nodes and a resumed run all need one), so an
object is written once into the run folder as a plain HF folder and the config is pointed at it:

============================  ===============================  =================================================
object                        folder                           config
============================  ===============================  =================================================
``model`` (+ ``tokenizer``)   ``<run_dir>/initial_model``      ``model.name``
``ref_model``                 ``<run_dir>/reference_model``    ``ref_model.path``
``reward_model`` (+ its       ``<run_dir>/reward_model``       ``reward.model_path``
tokenizer)
============================  ===============================  =================================================

The folders are kept as the run's models: the run's ``config.yaml`` names them, so ``resume=auto`` (from Python or
the command line) finds the same weights, and a resumed run does not write them again (the object passed then may
already hold trained weights). A ``peft`` model is written merged (``W + (alpha / r) B A``) and the run trains a new
LoRA adapter of the same rank, alpha, dropout and target modules on top, with the merged model as its reference.

After training, :func:`copy_trained_weights` loads ``<run_dir>/final_model`` into a plain ``PreTrainedModel`` the
caller passed, in place (on its device, in its dtype). A ``peft`` model is left as it was: the run's adapter is a
new one over merged weights, not the one passed, so the trained model is ``<run_dir>/final_model`` (merged) and its
adapter the newest checkpoint's ``adapter/``.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_rl.errors import ConfigError

log = logging.getLogger(__name__)

INITIAL_MODEL = "initial_model"
REFERENCE_MODEL = "reference_model"
REWARD_MODEL = "reward_model"


@dataclass
class ModelObjects:
    """What the caller passed; each may be None (the config's), a folder path, or an object.

    Attributes:
        tokenizer: None: the one saved with ``model`` (its ``name_or_path`` folder); ``reward_tokenizer`` likewise.
        ref_model: a causal LM with the policy's vocabulary; the policy object itself or None means the policy's
            initial weights.
        reward_model: a sequence-classification reward model (``num_labels=1``).
    """

    model: Any = None
    tokenizer: Any = None
    ref_model: Any = None
    reward_model: Any = None
    reward_tokenizer: Any = None

    def check(self) -> None:
        """Raise :class:`ConfigError` for what cannot be a model here, before anything is written."""
        for key, obj in (("model", self.model), ("ref_model", self.ref_model), ("reward_model", self.reward_model)):
            if obj is None or isinstance(obj, (str, Path)):
                continue
            if not (hasattr(obj, "save_pretrained") and hasattr(obj, "config")):
                raise ConfigError(
                    f"{key}= is a {type(obj).__name__}; pass a transformers PreTrainedModel (a peft "
                    "model for model=), or the path of a local HF folder"
                )
        if _is_peft(self.ref_model) or _is_peft(self.reward_model):
            raise ConfigError(
                "ref_model= and reward_model= take plain transformers models; merge a peft model first "
                "(model.merge_and_unload())"
            )
        if _is_peft(self.model):
            config = next(iter(self.model.peft_config.values()))
            if type(config).__name__ != "LoraConfig" or getattr(config, "use_dora", False):
                raise ConfigError(
                    f"model= is a peft model with a {type(config).__name__}"
                    f"{' (DoRA)' if getattr(config, 'use_dora', False) else ''}; only LoRA adapters are "
                    "supported: pass a LoRA model, or merge it (model.merge_and_unload())"
                )
        for key, obj in (("model", self.model), ("reward_model", self.reward_model)):
            tokenizer = self.tokenizer if key == "model" else self.reward_tokenizer
            if obj is not None and not isinstance(obj, (str, Path)) and tokenizer is None and _saved_with(obj) is None:
                raise ConfigError(
                    f"{key}= is an object not loaded from a local folder, so its tokenizer cannot be "
                    f"found; pass {'tokenizer' if key == 'model' else 'reward_tokenizer'}= too"
                )


def write_model_objects(cfg, run_dir: Path, objects: ModelObjects) -> None:
    """Write the objects of ``objects`` into ``run_dir`` (unless resuming from folders already there) and point
    ``cfg`` at them; paths are set as they are."""
    objects.check()
    resuming = bool(cfg.resume)
    if isinstance(objects.model, (str, Path)):
        cfg.model.name = str(objects.model)
    elif objects.model is not None:
        folder = run_dir / INITIAL_MODEL
        tokenizer = objects.tokenizer if objects.tokenizer is not None else _load_tokenizer(objects.model)
        if _is_peft(objects.model):
            _take_lora_settings(cfg, objects.model)
        _write(folder, objects.model, tokenizer, resuming)
        cfg.model.name = str(folder)
    if isinstance(objects.ref_model, (str, Path)):
        cfg.ref_model.path = str(objects.ref_model)
    elif objects.ref_model is not None and objects.ref_model is not objects.model:
        folder = run_dir / REFERENCE_MODEL
        _write(folder, objects.ref_model, None, resuming)
        cfg.ref_model.path = str(folder)
    if isinstance(objects.reward_model, (str, Path)):
        cfg.reward.model_path = str(objects.reward_model)
    elif objects.reward_model is not None:
        folder = run_dir / REWARD_MODEL
        tokenizer = (
            objects.reward_tokenizer if objects.reward_tokenizer is not None else _load_tokenizer(objects.reward_model)
        )
        _write(folder, objects.reward_model, tokenizer, resuming)
        cfg.reward.model_path = str(folder)


def copy_trained_weights(final_model: Path, model) -> bool:
    """Load the exported weights in ``final_model`` into the plain ``PreTrainedModel`` ``model`` in place; returns
    False, leaving it as it was, for a ``peft`` model (module docstring) or when no final model was exported.

    Raises:
        RuntimeError: the folder's weights do not fit ``model``.
    """
    if _is_peft(model):
        log.info(
            "model= was a peft model and is left as it was; the trained model is %s (merged weights), its "
            "adapter the newest checkpoint's adapter/",
            final_model,
        )
        return False
    files = sorted(Path(final_model).glob("*.safetensors"))
    if not files:
        log.warning("no final model in %s: the object passed as model= keeps its weights", final_model)
        return False
    import torch
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded = {t.data_ptr() for name, t in own.items() if name in state}
    untied = [name for name in missing if own[name].data_ptr() not in loaded]  # a tied weight shares a loaded one
    if unexpected or untied:
        raise RuntimeError(
            f"{final_model} does not fit the model passed as model= (missing {untied[:3]}, unexpected {unexpected[:3]})"
        )
    return True


def _write(folder: Path, model, tokenizer, resuming: bool) -> None:
    """``model`` (merged, for peft) and ``tokenizer`` as an HF folder, replaced atomically; kept when resuming."""
    if resuming and (folder / "config.json").is_file():
        log.info("resuming: %s is kept as it was written by the run's start", folder)
        return
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if _is_peft(model):
        from grpo_rl.model.lora import save_merged_pretrained

        save_merged_pretrained(model, partial)
    else:
        model.save_pretrained(partial, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(partial)
    if folder.exists():
        shutil.rmtree(folder)
    partial.rename(folder)
    log.info("%s written to %s", type(model).__name__, folder)


def _take_lora_settings(cfg, model) -> None:
    """``model.lora`` from the peft model's adapter config: a new adapter of the same shape is trained."""
    config = next(iter(model.peft_config.values()))
    targets = config.target_modules
    targets = [targets] if isinstance(targets, str) else sorted(targets)
    lora = cfg.model.lora
    lora.enabled, lora.r, lora.alpha, lora.dropout = (
        True,
        int(config.r),
        float(config.lora_alpha),
        float(config.lora_dropout),
    )
    lora.target_modules = targets
    log.info(
        "model= is a LoRA model: training a new adapter (r=%d, alpha=%g, dropout=%g, targets %s) on its merged weights",
        lora.r,
        lora.alpha,
        lora.dropout,
        ",".join(targets),
    )


def _is_peft(obj) -> bool:
    if obj is None or isinstance(obj, (str, Path)):
        return False
    from grpo_rl.model.lora import is_lora  # imports torch, which an object passed in has loaded already

    return is_lora(obj)


def _saved_with(obj) -> Path | None:
    """The local folder ``obj`` was loaded from, if it holds a tokenizer."""
    from grpo_rl.model.loading import missing_tokenizer

    name = getattr(obj, "name_or_path", None) or getattr(getattr(obj, "config", None), "_name_or_path", None)
    if not name or not Path(name).is_dir() or missing_tokenizer(name) is not None:
        return None
    return Path(name)


def _load_tokenizer(obj):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_saved_with(obj)))
