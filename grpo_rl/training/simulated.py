"""Timed stand-ins for the engine, the reference and the learner: the orchestration measured without the models.

With ``simulate.enabled=true`` the factories build these instead of the real roles, and everything else is the
real run: the same scripts, collector actors, environments and rewards, buffer, staleness gate, reference stage,
learner ranks with their collectives, weight pushes of the real (tiny) model's tensors, checkpoints and resume.
Each stand-in sleeps for its role's seconds per batch (``simulate.*_seconds``), scaled by ``1 + jitter * z`` with
``z`` standard normal (clipped at 0; drawn afresh in every process, so that replicas and a resumed run do not repeat
each other's draws), so ``benchmarks/system/pipeline_scale.py`` can set the stage times and see what the
pipeline makes of them at any number of collectors and learner ranks on one small machine: a sleeping worker needs
no core, so ``num_devices`` is not limited by the cores here.
"""

from __future__ import annotations

import random

import torch
from tensordict import TensorDict

from grpo_rl.engines.simulated import _sleep


class SimulatedRefScorer:
    """Sleeps ``seconds * N / batch_rows`` for ``N`` rows (a replica of a sharded stage scores its share) and adds
    ``ref_logprobs`` of -1 per answer token (what the simulated engine reports as its own)."""

    def __init__(self, *, seconds: float, jitter: float, batch_rows: int):
        self.seconds, self.jitter, self.batch_rows = seconds, jitter, batch_rows
        self.rng = random.Random()

    def score(self, batch: TensorDict) -> TensorDict:
        _sleep(self.seconds * batch.batch_size[0] / self.batch_rows, self.jitter, self.rng)
        batch.set("ref_logprobs", -batch["response_mask"].float())
        return batch

    def compile(self) -> None:
        """Nothing to compile."""


class SimulatedLearner:
    """Holds the real model (pushed and checkpointed as usual) but sleeps instead of training: an optimizer step
    on ``N`` rows takes ``seconds * N / batch_rows`` times a relative ``jitter``, ``epochs`` times per batch."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        *,
        seconds: float,
        jitter: float,
        batch_rows: int,
        epochs: int = 1,
    ):
        self.model, self.device = model, device
        self.seconds, self.jitter, self.batch_rows, self.epochs = seconds, jitter, batch_rows, epochs
        self.rng = random.Random()
        self.version, self.skipped_steps, self.lost = 0, 0, False
        self.data_parallel = None
        self.compiled = False

    def train_step(self, batch: TensorDict) -> dict[str, float]:
        rows = float(batch.batch_size[0])
        if self.data_parallel is not None:
            self.data_parallel.sum_scalars([rows])  # the collective a rank makes every step
        share = rows / self.batch_rows  # a data-parallel rank sleeps its share, so the group takes seconds / ranks
        slept = 0.0
        for _ in range(self.epochs):
            slept += _sleep(self.seconds * share, self.jitter, self.rng)
            self.version += 1
        return {
            "simulated_training_seconds": slept,
            "loss": 0.0,
            "loss_policy": 0.0,
            "grad_norm": 0.0,
            "lr": 0.0,
            "num_micro_batches": 1.0,
            "skipped_steps": 0.0,
            "step_skipped": 0.0,
        }

    def observe_step(self, seconds: float) -> None:
        """Nothing decides from a simulated step's time."""

    def named_weights(self):
        return list(self.model.state_dict().items())

    def weights_for_push(self):
        return self.named_weights()

    def state_dict(self) -> dict:
        return {"version": self.version, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.version, self.skipped_steps = state["version"], state["skipped_steps"]

    def shutdown(self) -> None:
        """Nothing to release."""
