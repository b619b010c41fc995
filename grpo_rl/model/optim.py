"""The learner's optimizer: ``optimizer.name`` = adamw | adamw8bit.

``adamw`` is torch's fused AdamW: one pass over memory, fp32 moments (8 bytes per parameter).

``adamw8bit`` is torchao's ``AdamW8bit``: the same update rule with both moments stored block-wise quantized to 8
bits (2 bytes per parameter instead of 8: 0.75 GiB less for a 135M model), dequantized, updated and requantized
inside one compiled kernel per parameter; bf16 weights (``train_model.dtype``) take each update with stochastic
rounding, so that updates below a weight's last bf16 bit are kept in expectation instead of lost. It is the
optimizer of the ``lowmem`` preset (``+preset=lowmem``): it trades a much slower step than fused AdamW's for the
memory (measured; see ``benchmarks/micro/optimizer_step.py``).

Why torchao: it is PyTorch's own library, runs on the CPU through ``torch.compile``, rounds bf16 weights
stochastically, and its state is tensor subclasses that ``torch.save``/``torch.load(weights_only=True)`` round-trip,
so checkpoints and bit-exact resume work unchanged. bitsandbytes' CPU ``AdamW8bit`` also runs here, and faster
over fp32 weights, but has no stochastic rounding, which bf16 weights need. The first torchao step also compiles
its kernels (tens of seconds the first time, then cached on disk by inductor).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING

from grpo_rl.config.schema import OPTIMIZERS
from grpo_rl.errors import ConfigError
from grpo_rl.quiet import filter_handlers, verbose

if TYPE_CHECKING:  # torch is imported where an optimizer is made
    import torch


# Messages torchao prints on import that say nothing about this run: CUDA kernels absent from a CPU build, Triton
# absent on a CPU. (torch's note on torchao's enums, printed at import or at the first compile, is in quiet.BENIGN.)
_IMPORT_LOGGERS = ("torchao", "torchao.kernel.intmm")


def _adamw8bit_class():
    filter_handlers("torch.utils._pytree")
    quiet = [] if verbose() else [logging.getLogger(name) for name in _IMPORT_LOGGERS]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore")
            # torchao is the optional lowmem extra: absent from a plain install, hence the ImportError below
            from torchao.optim import AdamW8bit  # pyright: ignore[reportMissingImports]
    except ImportError as e:
        raise ConfigError(
            f"optimizer.name=adamw8bit (the lowmem preset) needs torchao ({e}): install the lowmem "
            "extra (GRPO_EXTRAS=lowmem bash scripts/setup.sh, or pip install -e '.[lowmem]'), or set "
            "optimizer.name=adamw"
        ) from None
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    return AdamW8bit


def check_optimizer(name: str, device_type: str) -> None:
    """Fail fast, before any engine starts, where ``name`` cannot run on ``device_type``: adamw8bit needs torchao
    and a working ``torch.compile`` (a C++ compiler on the CPU)."""
    if name != "adamw8bit":
        return
    _adamw8bit_class()
    from grpo_rl.model.compile import compiler_problem

    problem = compiler_problem(device_type)
    if problem is not None:
        raise ConfigError(
            f"optimizer.name=adamw8bit compiles its update with torch.compile, which does not work on "
            f"{device_type} here ({problem}): install a C++ compiler, or set optimizer.name=adamw"
        )


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    name: str,
    device: torch.device,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> torch.optim.Optimizer:
    """AdamW over ``params`` with the moments ``name`` says (see the module docstring)."""
    import torch

    params = list(params)
    if name == "adamw":
        fused = device.type in ("cpu", "cuda")
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
    if name == "adamw8bit":
        if not verbose():  # printed at its first compiled step: a note to torchao's authors, not to this run's user
            warnings.filterwarnings("ignore", message=".*does not implement _stable_hash_for_caching")
        # bf16 weights (train_model.dtype) take each update with stochastic rounding: exact in expectation
        return _adamw8bit_class()(
            params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bf16_stochastic_round=True
        )
    raise ConfigError(f"optimizer.name={name!r}: use one of {', '.join(OPTIMIZERS)}")
