"""LoRA (Hu et al., 2021) through peft: adapters on the policy, the frozen base as the reference, merged weights out.

* :func:`apply_lora` wraps the learner's model in a ``peft`` ``PeftModel``: only the adapter matrices ``A``
  and ``B`` train, every base weight is frozen, so the optimizer state is a few MB.
* The reference model is the same module with its adapters switched off (``PeftModel.disable_adapter()``),
  not a second copy: :class:`AdapterDisabledRefScorer`. Since ``B`` starts at zero, the reference is exactly
  the initial policy, as with a separate frozen copy, and the KL to it starts at 0.
* Exported folders, and engines that cannot apply adapters, get merged weights ``W + (alpha / r) B A`` under the
  plain HF names (:func:`merged_state_dict`). They are computed out of place: the trainable model keeps its
  adapters and its unmerged base weights bit for bit (peft's ``merge``/``unmerge`` round trip would perturb them
  by rounding on every push).
* A vLLM engine applies the adapter itself (``model.lora.push``): a push then carries the adapter's tensors alone
  (:func:`adapter_named_weights`, peft's names), which the engine writes as a peft folder
  (:func:`write_adapter`) and loads as a new LoRA version; its base weights never change.

Departure from the paper: none beyond peft's defaults (Kaiming-uniform ``A``, zero ``B``, dropout on the
adapter input only). DoRA and adapters on embeddings are not supported by the merge.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

ADAPTER_DIR = "adapter"
"""Where a checkpoint keeps a LoRA run's adapter (``adapter_config.json`` + ``adapter_model.safetensors``)."""


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a peft model carrying adapters."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def apply_lora(
    model: torch.nn.Module, *, r: int, alpha: float, dropout: float, target_modules: Sequence[str]
) -> torch.nn.Module:
    """Wrap ``target_modules`` (``q_proj``, ..., or ``["all-linear"]``) of the HF causal LM ``model``, already on
    its device, in rank-``r`` LoRA adapters (update ``(alpha / r) B A``) and freeze everything else; returns the
    ``PeftModel`` (``model`` itself is modified)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = list(target_modules)
    config = PeftLoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        bias="none",
        task_type="CAUSAL_LM",
        target_modules="all-linear" if targets == ["all-linear"] else targets,
    )
    return get_peft_model(model, config)


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of ``model`` with its active adapters folded in, without modifying it, under the base
    model's own names (``model.layers.0.self_attn.q_proj.weight``); a plain model's is returned as is."""
    if not is_lora(model):
        return dict(model.state_dict())
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer) or module.merged:
            continue
        if getattr(module, "use_dora", {}) and any(module.use_dora.values()):
            raise NotImplementedError("merging DoRA adapters is not supported")
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                delta = module.get_delta_weight(adapter)
                deltas[name] = delta if name not in deltas else deltas[name] + delta
    merged: dict[str, torch.Tensor] = {}
    for key, tensor in base.state_dict().items():
        if ".lora_" in key:
            continue
        module_name, sep, _ = key.partition(".base_layer.")
        if sep and key.endswith(".base_layer.weight") and module_name in deltas:
            tensor = tensor + deltas[module_name].to(tensor.dtype)
        merged[key.replace(".base_layer.", ".")] = tensor.detach()
    return merged


def hf_named_weights(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs in HF naming for a weight push: merged for a LoRA model, the model's own otherwise."""
    return merged_state_dict(model).items()


def adapter_named_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The adapter's ``(name, tensor)`` pairs as peft saves them (``base_model.model.<module>.lora_A.weight``):
    what an adapter push carries."""
    from peft.utils import get_peft_model_state_dict

    return [(name, t.detach()) for name, t in get_peft_model_state_dict(model).items()]


def is_adapter_push(names: Iterable[str]) -> bool:
    """Whether a push of tensors named ``names`` carries an adapter (every name a LoRA matrix) and no base weight."""
    names = list(names)
    return bool(names) and all(".lora_A." in n or ".lora_B." in n for n in names)


def write_adapter(out_dir: str | Path, named: dict[str, torch.Tensor], alpha: float) -> int:
    """Write the adapter tensors ``named`` (:func:`adapter_named_weights`) as a peft folder that vLLM loads: the
    weights, and a config whose rank and target modules are read off them; the bytes written."""
    import json

    from safetensors.torch import save_file

    ranks = {t.shape[0] for n, t in named.items() if ".lora_A." in n}
    if len(ranks) != 1:
        raise ValueError(f"adapter tensors of ranks {sorted(ranks)}: one rank expected")
    targets = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in named})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": ranks.pop(),
        "lora_alpha": alpha,
        "target_modules": targets,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }
    out = Path(out_dir)
    out.mkdir(parents=True)
    save_file({n: t.contiguous() for n, t in named.items()}, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(config))
    return sum(f.stat().st_size for f in out.iterdir())


def save_merged_pretrained(model: torch.nn.Module, out_dir: str | Path) -> None:
    """Write a LoRA model's merged weights and config as a plain HF folder (no adapter files)."""
    base = model.get_base_model()
    base.save_pretrained(out_dir, state_dict=merged_state_dict(model), safe_serialization=True)


def save_adapter(model: torch.nn.Module, out_dir: str | Path) -> None:
    """Write the adapter weights and config (peft's format: loadable with ``PeftModel.from_pretrained``)."""
    model.save_pretrained(str(out_dir), safe_serialization=True)


def load_adapter(model: torch.nn.Module, adapter_dir: str | Path) -> None:
    """Load adapter weights written by :func:`save_adapter` into ``model`` in place (exactly, no renaming loss)."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(adapter_dir) / "adapter_model.safetensors"
    if not path.exists():
        raise FileNotFoundError(f"{adapter_dir}: no adapter_model.safetensors (not a LoRA checkpoint?)")
    device = next(model.parameters()).device
    result = set_peft_model_state_dict(model, load_file(path, device=str(device)))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise RuntimeError(f"{adapter_dir}: adapter weights do not fit this model (unexpected keys {unexpected[:3]})")
