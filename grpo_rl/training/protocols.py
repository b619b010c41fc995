"""What the loop asks of a learner and of a reference scorer, whichever process they run in.

A :class:`LearnerProtocol` is the in-process :class:`~grpo_rl.training.learner.Learner`, a group of data-parallel or
FSDP2-sharded ranks (:class:`~grpo_rl.distributed.learner_group.LearnerGroup`), or the timed stand-in of the scale
simulation (:class:`~grpo_rl.training.simulated.SimulatedLearner`). A :class:`ReferenceScorer` is the in-process
:class:`~grpo_rl.training.reference.RefScorer`, the LoRA learner's own model with its adapters off, reference
actors, or the stand-in. The loop never asks which one it holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch
from tensordict import TensorDict


class LearnerProtocol(Protocol):
    """Trains the policy on scored batches; the policy version counts its optimizer steps."""

    version: int
    """Optimizer steps taken (the policy version the weights it pushes carry)."""
    model: torch.nn.Module
    """A full copy of the policy in this process, which checkpoints are loaded into and exported from."""
    compiled: bool
    """Whether its forward and backward run compiled (``train.compile``): the reference follows."""
    skipped_steps: int
    """Optimizer steps skipped for a non-finite loss or gradient (the weights did not move; checkpointed)."""
    lost: bool
    """Whether it lost a rank and holds no usable state any more (only a learner group can)."""

    def train_step(self, batch: TensorDict) -> dict[str, float]:
        """``train.updates_per_batch`` optimizer steps on ``batch`` ``[N]``; returns the step's metrics."""
        ...

    def observe_step(self, seconds: float) -> None:
        """The reference and training seconds of the step just made (``train.compile=auto`` decides from them)."""
        ...

    def weights_for_push(self) -> object:
        """The current weights, in the form the run's weight sync sends (named tensors or a packet)."""
        ...

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def shutdown(self) -> None: ...


class ReferenceScorer(Protocol):
    """Adds ``ref_logprobs`` ``[N, Lr]`` (the frozen initial policy's log-probs of the answer tokens) to a batch."""

    def score(self, batch: TensorDict) -> TensorDict: ...

    def compile(self) -> None:
        """Compile the forward where it runs in this process (a no-op elsewhere, and once compiled)."""
        ...
