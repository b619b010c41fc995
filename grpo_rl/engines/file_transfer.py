"""The worker side of the ``grpo_rl_file`` weight transport, imported by vLLM inside a server (see
:mod:`grpo_rl.engines.vllm_plugin`): load the safetensors file the trainer names into the model.

The file is read once, without following a symlink, and loaded from those bytes only if their SHA-256 is the one
the trainer sent (:func:`~grpo_rl.engines.weight_folder.read_weight_file`): a file swapped or changed in the folder
after the trainer wrote it is refused, never loaded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from safetensors.torch import load
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

from grpo_rl.engines.weight_folder import read_weight_file


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    directory: str
    """The folder weight files are read from; a file named in an update must lie directly in it."""


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    file: str
    """The file's name in the weight folder (random, never a path)."""
    num_tensors: int
    sha256: str
    """The hex SHA-256 of the file as the trainer wrote it; a file whose bytes differ is refused."""
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
        data = read_weight_file(self.directory, update_info.file, update_info.sha256)
        weights = load(data)
        del data  # the tensors hold their own copy
        if len(weights) != update_info.num_tensors:
            raise ValueError(
                f"weight file {update_info.file} holds {len(weights)} tensors; the trainer wrote "
                f"{update_info.num_tensors}"
            )
        named = list(weights.items()) + [(alias, weights[name]) for alias, name in update_info.aliases.items()]
        self.model.load_weights(named)

    def finish_weight_update(self) -> None:
        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self.directory = None
