"""The reference scorer: log-probs of the sampled answers under the frozen reference model.

It adds ``ref_logprobs`` ``[N, Lr]`` to the batch (:mod:`grpo_rl.rollout.collector` lists every stage's keys), for the
KL penalty of the loss or of the reward. A LoRA run's reference is the learner's own model with its adapters off
(:class:`grpo_rl.training.reference.AdapterDisabledRefScorer`).

The reference log-probs are untruncated even when the engine samples with top-k / top-p (the policy's are truncated):
the reference's own truncated set could exclude a sampled token; :mod:`grpo_rl.model.vocab` explains the KL that
results.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from tensordict import TensorDict

from grpo_rl.model.compile import compile_model
from grpo_rl.model.logprobs import sequence_logprobs
from grpo_rl.model.lora import is_lora
from grpo_rl.model.packing import group_micro_batches, micro_batches


class RefScorer:
    """Scores the sampled answers under the frozen reference model, micro-batched by tokens (with
    ``share_prompt``, each group's prompt run once)."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        *,
        temperature: float = 1.0,
        micro_batch_tokens: int = 8192,
        bf16_autocast: bool = False,
        share_prompt: bool = False,
        attention: str = "auto",
    ):
        self.model = model
        self.attention = attention
        self.device = device
        self.temperature = temperature
        self.micro_batch_tokens = micro_batch_tokens
        self.bf16_autocast = bf16_autocast
        self.share_prompt = share_prompt
        self.compiled = False

    def compile(self) -> None:
        """Compile the reference's decoder layers (once): the learner decided to (:mod:`grpo_rl.model.compile`)."""
        if not self.compiled:
            self.compiled = compile_model(self.model, self.device, "reference")

    @torch.no_grad()
    def score(self, batch: TensorDict) -> TensorDict:
        lr = batch["response_ids"].shape[1]
        out = torch.zeros(batch["response_ids"].shape, dtype=torch.float32)
        row = 0
        keys = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
        keys += ("group_id",) if self.share_prompt else ()  # packing's groups
        model_view = batch.select(*keys).to(self.device)
        split = group_micro_batches if self.share_prompt else micro_batches
        for mb in split(model_view, self.micro_batch_tokens):
            ctx = torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16_autocast else nullcontext()
            with ctx:
                lp = (
                    sequence_logprobs(
                        self.model,
                        mb,
                        temperature=self.temperature,
                        share_prompt=self.share_prompt,
                        attention=self.attention,
                    )
                    .logprobs.float()
                    .cpu()
                )
            out[row : row + lp.shape[0], : lp.shape[1]] = lp
            row += lp.shape[0]
        assert row == batch.batch_size[0] and out.shape[1] == lr
        batch.set("ref_logprobs", out)
        return batch


class AdapterDisabledRefScorer(RefScorer):
    """The reference scorer of a LoRA run: the learner's own ``PeftModel`` (shared, not copied) with its adapters
    switched off; ``kwargs`` as :class:`RefScorer`."""

    def __init__(self, model: torch.nn.Module, device: torch.device, **kwargs):
        if not is_lora(model):
            raise TypeError("AdapterDisabledRefScorer needs a peft model (model.lora.enabled=true)")
        super().__init__(model, device, **kwargs)

    def score(self, batch: TensorDict) -> TensorDict:
        # LoRA dropout sits on the adapter path, which disable_adapter() skips, so train mode is harmless here.
        with self.model.disable_adapter():
            return super().score(batch)
