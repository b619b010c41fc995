"""The learner: micro-batched GRPO updates with gradient accumulation.

One :meth:`Learner.train_step` trains on one batch: ``train.updates_per_batch`` optimizer steps over all of it (one by
default), and the policy version counts optimizer steps. The batch is cut into
micro-batches under a token budget (rows x padded length), each trimmed to its own longest prompt and answer.
Each micro-batch's loss is scaled by its share of the batch's tokens (``token_mean``) or rows (the per-sequence
aggregations), so the accumulated gradient equals that of the full batch in one pass.

When a batch is used for a single optimizer step (``epochs == 1``) the "old" policy equals the current one,
so no separate old-log-prob pass is run: ``old_logprobs = logprobs.detach()``, the ratio is 1 with gradient
``grad logprobs``, exactly GRPO's single-update case. With more epochs the old log-probs are computed once,
without gradients, before the first epoch.

A step whose loss or gradient is not finite is skipped (no parameter changes), counted and logged.

A model sharded with :func:`~grpo_rl.distributed.sharding.shard_model` holds collectives in every forward and
backward, so every rank runs as many passes as the rank with the most micro-batches (the others repeat their last
micro-batch with weight 0) and a non-finite loss does not end a rank's passes early.
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext

import torch
from tensordict import TensorDict
from torch.distributed.fsdp import FSDPModule

from grpo_rl.algo.loss import LossSettings, grpo_loss
from grpo_rl.config.schema import parse_compile_mode
from grpo_rl.model.compile import CompileDecision, compile_model
from grpo_rl.model.logprobs import sequence_logprobs
from grpo_rl.model.lora import adapter_named_weights, hf_named_weights, is_lora
from grpo_rl.model.optim import make_optimizer
from grpo_rl.model.packing import group_micro_batches, micro_batches

log = logging.getLogger(__name__)

MODEL_KEYS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


def loss_mask(batch: TensorDict) -> torch.Tensor:
    """``[N, Lr]``: the answer tokens the loss covers: the model's own (``loss_mask``, multi-turn episodes, where
    tool and template tokens are context only, :mod:`grpo_rl.envs.multiturn`), else every answer token."""
    return batch["loss_mask"] if "loss_mask" in batch.keys() else batch["response_mask"]


class Learner:
    """Owns the trainable model, its optimizer and LR schedule, and the policy version.

    Args:
        model: the trainable causal LM, already on ``device`` or sharded by
            :func:`~grpo_rl.distributed.sharding.shard_model` (which must come first).
        optimizer: adamw | adamw8bit (:mod:`grpo_rl.model.optim`); ``lr``, ``betas``, ... are AdamW's.
        max_grad_norm: gradient-norm clip (0 disables).
        epochs: optimizer steps per batch.
        share_prompt: run each group's prompt once per forward (:mod:`grpo_rl.model.packing`); micro-batches then
            hold whole groups and ``micro_batch_tokens`` counts packed tokens.
        attention: how a packed row is attended: auto | prefix | dense
            (:func:`~grpo_rl.model.logprobs.packed_attention`).
        compile: auto | true | false (:mod:`grpo_rl.model.compile`); ``total_steps`` feeds auto's estimate.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        loss: LossSettings,
        *,
        optimizer: str = "adamw",
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.99),
        eps: float = 1e-8,
        warmup_steps: int = 0,
        max_grad_norm: float = 1.0,
        micro_batch_tokens: int = 4096,
        epochs: int = 1,
        bf16_autocast: bool = False,
        gradient_checkpointing: bool = False,
        share_prompt: bool = False,
        attention: str = "auto",
        compile: str = "false",
        total_steps: int = 0,
        push_adapter: bool = False,
    ):
        self.model = model
        self.push_adapter = push_adapter  # a LoRA model's pushes carry its adapter alone (model.lora.push)
        self.device = device
        self.loss = loss
        self.max_grad_norm = max_grad_norm
        self.micro_batch_tokens = micro_batch_tokens
        self.epochs = epochs
        self.bf16_autocast = bf16_autocast
        self.share_prompt = share_prompt
        self.attention = attention
        self.sharded = isinstance(model, FSDPModule)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(
            params, optimizer, device, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
        )
        warm = max(0, warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
        )
        self.version = 0
        self.skipped_steps = 0
        self.lost = False  # a learner in this process never loses a rank
        self.data_parallel = None
        """A :class:`~grpo_rl.distributed.data_parallel.GradientAllReduce` when this is one rank of a
        data-parallel learner (a :class:`~grpo_rl.distributed.sharding.ShardedDataParallel` for a sharded model):
        shares, gradients and diagnostics are then summed over ranks."""
        compile = parse_compile_mode(compile)
        if compile != "false" and (self.sharded or is_lora(model)):
            compile = "false"  # FSDP and LoRA learners stay eager (grpo_rl/model/compile.py)
        self.compile_decision = CompileDecision(compile, total_steps)
        self.compiled = False
        """Whether the decoder layers run compiled (part of the checkpointed state: a resumed run compiles too)."""
        if compile == "true":
            self.compile()

    def compile(self) -> None:
        """Compile the model's decoder layers (once; stays eager where the toolchain cannot compile)."""
        if not self.compiled:
            self.compiled = compile_model(self.model, self.device, "learner")
            self.compile_decision.mode = "done"

    def observe_step(self, seconds: float) -> None:
        """``train.compile=auto``: one step's reference + training seconds; compiles when it pays."""
        if self.compile_decision.observe(seconds, self.version // max(1, self.epochs)):
            self.compile()

    def _autocast(self):
        if not self.bf16_autocast:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def _logprobs(self, mb: TensorDict, with_entropy: bool, entropy_grad: bool = False):
        with self._autocast():
            return sequence_logprobs(
                self.model,
                mb,
                temperature=self.loss.temperature,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
                share_prompt=self.share_prompt,
                attention=self.attention,
                top_p=self.loss.top_p,
                top_k=self.loss.top_k,
            )

    def train_step(self, batch: TensorDict) -> dict[str, float]:
        """Run ``epochs`` optimizer steps on ``batch`` (the model keys, ``advantage`` ``[N]``,
        ``behavior_logprobs`` and, with KL in the loss, ``ref_logprobs``); return the last one's diagnostics,
        token- or row-weighted means over its micro-batches. In this process (not a data-parallel rank) it also sets
        ``learner_logprobs`` ``[N, Lr]`` on ``batch``: pi_old of each answer token, which the sample logs show."""
        given, batch = batch, batch.to(self.device)
        split = group_micro_batches if self.share_prompt else micro_batches
        chunks = split(batch, self.micro_batch_tokens)
        total_tokens, total_rows = float(loss_mask(batch).sum()), float(batch.batch_size[0])
        counts: list[float] = []
        if self.data_parallel is not None:  # each micro-batch's share is of the batch over all ranks
            dp = self.data_parallel
            if self.sharded:  # every rank's micro-batch count, each in its own slot of the sum
                counts = [float(len(chunks)) if r == dp.rank else 0.0 for r in range(dp.world_size)]
            total_tokens, total_rows, *counts = dp.sum_scalars([total_tokens, total_rows, *counts])
        if counts and min(counts) == 0:  # raised on every rank alike
            raise ValueError("a sharded model needs at least one row on every rank (fewer rows than ranks?)")
        passes = self._passes(chunks, int(max(counts, default=len(chunks))))
        if self.epochs > 1:
            with torch.no_grad():
                for mb, padding in passes:
                    old = self._logprobs(mb, with_entropy=False)
                    if not padding:
                        mb.set("old_logprobs", old.logprobs)
                        if old.outside is not None:  # a stand-in old log-prob masks the token as well
                            mb.set("old_outside", old.outside)
        total_tokens = max(total_tokens, 1.0)
        metrics: dict[str, float] = {}
        olds: list[torch.Tensor] = []  # pi_old of each micro-batch, in row order: kept for the sample logs
        for epoch in range(self.epochs):
            metrics = self._optimizer_step(passes, total_tokens, total_rows, olds if epoch == 0 else None)
        if self.data_parallel is None:
            _keep_learner_logprobs(given, olds)
        metrics["num_micro_batches"] = float(len(chunks))
        return metrics

    @staticmethod
    def _passes(chunks: list[TensorDict], num_passes: int) -> list[tuple[TensorDict, bool]]:
        """``(micro-batch, is_padding)`` for ``num_passes`` passes: the micro-batches, then the last one again."""
        return [(mb, False) for mb in chunks] + [(mb, True) for mb in chunks[-1:] * (num_passes - len(chunks))]

    def _optimizer_step(
        self,
        passes: list[tuple[TensorDict, bool]],
        total_tokens: float,
        total_rows: float,
        olds: list[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        finite = True
        for mb, padding in passes:
            share = (
                0.0
                if padding
                else float(loss_mask(mb).sum()) / total_tokens
                if self.loss.aggregation == "token_mean"
                else mb.batch_size[0] / total_rows
            )
            out = self._logprobs(mb, with_entropy=True, entropy_grad=self.loss.entropy_coef > 0)
            old = mb["old_logprobs"] if "old_logprobs" in mb.keys() else out.logprobs.detach()
            if olds is not None and not padding:
                olds.append(old)
            outside = out.outside
            if outside is not None and "old_outside" in mb.keys():
                outside = outside | mb["old_outside"]
            result = grpo_loss(
                out.logprobs,
                old,
                mb["advantage"],
                loss_mask(mb),
                ref_logprobs=mb.get("ref_logprobs", None),
                behavior_logprobs=mb["behavior_logprobs"],
                settings=self.loss,
                entropy=out.entropy,
                scale=share,
                outside=outside,
            )
            if not torch.isfinite(result.loss):
                finite = False
                if not self.sharded:
                    break
            result.loss.backward()  # sharded: even a non-finite one, as the other ranks' backward waits on it
            if not finite or padding:
                continue
            for k, v in result.diagnostics().items():
                # loss terms are already scaled by share; diagnostics are per-micro-batch means
                weight = 1.0 if k.startswith("loss") else share
                sums[k] = sums.get(k, 0.0) + weight * v
        if self.data_parallel is not None:  # every rank skips, or every rank steps on the summed gradient
            finite = self.data_parallel.all_finite(finite)
            if finite:
                self.data_parallel.sum_gradients([p for p in self.model.parameters() if p.requires_grad])
                sums = self.data_parallel.sum_metrics(sums)
        grad_norm = float("nan")
        lr = self.optimizer.param_groups[0]["lr"]  # the rate this step uses; scheduler.step() below moves it on
        if finite:
            params = [p for p in self.model.parameters() if p.grad is not None]
            max_norm = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            finite = math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
            self.scheduler.step()
            self.version += 1
        else:
            self.skipped_steps += 1
            log.warning("non-finite loss or gradient: optimizer step skipped (%d so far)", self.skipped_steps)
        self.optimizer.zero_grad(set_to_none=True)
        sums.update(grad_norm=grad_norm, lr=lr, skipped_steps=float(self.skipped_steps), step_skipped=float(not finite))
        return sums

    def shutdown(self) -> None:
        """Nothing to release in-process (a :class:`~grpo_rl.distributed.learner_group.LearnerGroup` stops its
        ranks)."""

    def named_weights(self):
        """``(name, tensor)`` pairs in HF naming, for the engine's ``update_weights`` (LoRA: merged, out of place)."""
        return hf_named_weights(self.model)

    def weights_for_push(self):
        """What a :class:`~grpo_rl.weights.sync.WeightSync` pushes: :meth:`named_weights`, or a LoRA model's adapter
        alone where the engines apply it (a data-parallel group hands over a packet already in the object store)."""
        return adapter_named_weights(self.model) if self.push_adapter else self.named_weights()

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
            "skipped_steps": self.skipped_steps,
            "compiled": self.compiled,
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = state["version"]
        self.skipped_steps = state["skipped_steps"]
        if state.get("compiled") and self.compile_decision.mode != "false":
            self.compile()  # the run being resumed had compiled: the same kernels from the first step


def _keep_learner_logprobs(batch: TensorDict, olds: list[torch.Tensor]) -> None:
    """Set ``learner_logprobs`` ``[N, Lr]`` on ``batch``: the learner's log-prob of each answer token before the
    update (pi_old), from the micro-batches' ``olds`` (consecutive rows, each ``[b, <= Lr]``), for the sample logs.
    Left unset when the micro-batches do not cover the batch (a non-finite loss stopped the pass)."""
    if sum(o.shape[0] for o in olds) != batch.batch_size[0]:
        return
    full = torch.zeros_like(batch["behavior_logprobs"], dtype=torch.float32)  # [N, Lr]
    row = 0
    for old in olds:
        width = min(old.shape[1], full.shape[1])
        full[row : row + old.shape[0], :width] = old[:, :width].detach().float().to(full.device)
        row += old.shape[0]
    batch.set("learner_logprobs", full)
