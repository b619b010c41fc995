"""Compiling the decoder layers of the learner and the reference model (``train.compile``).

``torch.compile`` fuses the elementwise work between the matmuls of a decoder layer (norms, rotary embeddings,
activations, casts) into generated kernels, which speeds up a packed training forward + backward timed alone
(measured; see ``benchmarks/micro/kernels.py compile``). The price is the compilation: Dynamo traces a layer and
Inductor generates and builds its kernels, seconds to a minute on the first call, which a short run never earns back.
Each decoder layer is compiled on its own (``dynamic=True``: micro-batches of every shape share one graph; the
layers share their code, so one trace serves all of them); the LM head stays eager (:mod:`grpo_rl.model.vocab`
already chunks it).

Whether it pays is a measurement, not a given: on a CPU where the pass timed alone gained, the whole step did not
(``benchmarks/versus_trl/trl_compare.py``; benchmarks/README.md, "Levers"). So the default is ``false``; measure your
own step with ``true``.

``train.compile``:

* ``false`` (default): eager, always.
* ``true``: compile before the first step.
* ``auto``: start eager, time the reference and training phases of the first :data:`DECIDE_AFTER` steps,
  and compile once the expected saving over the steps left, ``SAVING x seconds per step x steps left``, exceeds
  :data:`COMPILE_COST_S`. At 20 s of reference and training a step, the 28 steps left of a 30-step run are worth
  ~110 s: it compiles; a smoke run of a tiny model (well under a second a step) never does. Inductor keeps the
  kernels it built in its on-disk cache (``TORCHINDUCTOR_CACHE_DIR``), so the next run with the same shapes pays
  less.

The decision is the learner's state: a checkpoint records it, and a resumed run with ``train.compile`` true or auto
compiles from its first step, so it computes with the same kernels as the run it continues (``false`` keeps it
eager). LoRA and FSDP-sharded learners stay eager (untested under compilation). Before the first compilation a small
function is compiled through the same backend, forward and backward; where that fails (no C++ compiler on the CPU,
an unsupported GPU) the run stays eager and logs one line that says why.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DECIDE_AFTER = 2
"""Steps timed eagerly before ``auto`` decides (the first step of a process carries one-off costs)."""
SAVING = 0.2
"""Share of the reference + training time compilation saves: ``1 - 1 / speedup`` of the pass timed alone, between
its fp32 and bf16 values (``benchmarks/micro/kernels.py compile``; benchmarks/README.md, "Levers")."""
COMPILE_COST_S = 60.0
"""What ``auto`` budgets for compiling: the first compiled forward + backward and the reference's no-grad graph."""


@dataclass
class CompileDecision:
    """``auto``'s bookkeeping: the learner-side seconds of the eager steps seen so far."""

    mode: str
    total_steps: int
    seconds: tuple[float, ...] = ()

    def observe(self, seconds: float, steps_done: int) -> bool:
        """Record one step's reference + training seconds (``steps_done`` steps finished); True when it is time
        to compile."""
        if self.mode != "auto" or len(self.seconds) >= DECIDE_AFTER:
            return False
        self.seconds += (seconds,)
        if len(self.seconds) < DECIDE_AFTER:
            return False
        left = max(0, self.total_steps - steps_done)
        per_step = min(self.seconds)
        worth = SAVING * per_step * left
        go = worth > COMPILE_COST_S
        log.info(
            "train.compile=auto: %s (%.1f s of reference + training a step x %d steps left x %.2f saved = "
            "%.0f s, against ~%.0f s to compile)",
            "compiling the decoder layers" if go else "staying eager",
            per_step,
            left,
            SAVING,
            worth,
            COMPILE_COST_S,
        )
        return go


@functools.cache
def compiler_problem(device_type: str) -> str | None:
    """None when ``torch.compile`` builds and runs a forward + backward on ``device_type``, else why not
    (checked once per process: a few seconds the first time, Inductor's cache after that)."""
    import torch

    def probe(x):
        return torch.nn.functional.silu(x).mul(2.0).sum()

    try:
        compiled = torch.compile(probe, dynamic=True)
        x = torch.randn(8, 16, device=device_type, requires_grad=True)
        compiled(x).backward()
        if x.grad is None or not torch.isfinite(x.grad).all():
            return "the compiled probe gave no gradient"
    except Exception as e:  # any failure of the toolchain means: stay eager
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first[:200]}"
    return None


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of an HF causal LM (PEFT-wrapped or not)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(base.get_decoder().layers)


def compile_model(model: torch.nn.Module, device: torch.device, who: str) -> bool:
    """Compile every decoder layer of ``model`` in place (``nn.Module.compile``: the module and its parameters stay
    the same objects, so checkpoints and weight pushes are unchanged). False, with one logged line, when the
    toolchain cannot compile on ``device``."""
    problem = compiler_problem(device.type)
    if problem is not None:
        log.warning(
            "train.compile: torch.compile does not work on %s here (%s); the %s stays eager. Install a C++ "
            "compiler (CPU) or set train.compile=false to skip this check.",
            device.type,
            problem,
            who,
        )
        return False
    for layer in decoder_layers(model):
        layer.compile(dynamic=True)
    log.info("train.compile: the %s's %d decoder layers compile on their next call", who, len(decoder_layers(model)))
    return True
