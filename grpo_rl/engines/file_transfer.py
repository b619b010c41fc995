"""The worker side of the ``grpo_rl_file`` weight transport, imported by vLLM inside a server (see
:mod:`grpo_rl.engines.vllm_plugin`): load the safetensors file the trainer names into the model."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from safetensors.torch import load_file
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    directory: str
    """The folder weight files are read from; a file named in an update must lie directly in it."""


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    file: str
    num_tensors: int
    aliases: dict[str, str] = field(default_factory=dict)
    """``{alias: name}``: tied tensors cross once and are loaded under every name (vLLM's reload must see
    ``lm_head.weight`` as well as ``embed_tokens.weight``)."""


class SharedFileWeightTransfer(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
    """Loads the named file through vLLM's layerwise reload (which also repacks CPU linear kernels)."""

    init_info_cls = FileInitInfo
    update_info_cls = FileUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.directory: Path | None = None

    def init_transfer_engine(self, init_info: FileInitInfo) -> None:
        directory = Path(init_info.directory).resolve()
        if not directory.is_dir():
            raise ValueError(f"weight folder {directory} does not exist on this server")
        self.directory = directory

    def start_weight_update(self) -> None:
        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: FileUpdateInfo) -> None:
        if self.directory is None:
            raise RuntimeError("update_weights came before init_weight_transfer_engine")
        path = (self.directory / update_info.file).resolve()
        if path.parent != self.directory:
            raise ValueError(f"weight file {update_info.file!r} is not in the weight folder")
        weights = load_file(str(path))
        if len(weights) != update_info.num_tensors:
            raise ValueError(f"{path} holds {len(weights)} tensors; the trainer wrote {update_info.num_tensors}")
        named = list(weights.items()) + [(alias, weights[name]) for alias, name in update_info.aliases.items()]
        self.model.load_weights(named)

    def finish_weight_update(self) -> None:
        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self.directory = None
