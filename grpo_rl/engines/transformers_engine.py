"""transformers rollout engine: the fallback when vLLM is not installed, and a reference for tests.

It samples with ``model.generate`` on left-padded prompts and reads the sampled tokens' log-probs from the
processed scores (temperature, top-k and top-p applied, in that order), as vLLM's ``processed_logprobs`` does,
one decoding step at a time (one ``[batch, vocab]`` tensor held, not one per step). It holds its own copy of the
model, so ``update_weights`` copies tensors, or, built with :meth:`TransformersEngine.sharing`, generates with the
learner's own model (``inference_model.share_weights``: no second copy of the weights and nothing to push). There
is no KV-cache reuse across a group's answers.

On a GPU, eager decoding of a small model is bound by the host launching kernels, not by the GPU.
``inference_model.compile`` gives ``generate`` a static KV cache, whose decoding step transformers compiles into
CUDA graphs: generation many times faster after a compile of tens of seconds (measured; see
``benchmarks/micro/gpu_engine.py`` and benchmarks/README.md, "One GPU").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext

import torch
from tensordict import TensorDict
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from grpo_rl.engines.base import GroupRequest, SamplingSpec, pack_rollouts, stream_by_calls
from grpo_rl.model.loading import load_causal_lm, load_tokenizer


class SampledLogprobs(LogitsProcessor):
    """The last logits processor of a sampling call: it keeps the processed distribution of one step and, called
    for the next, reads off the log-prob of the token sampled from it (the last column of ``input_ids``)."""

    def __init__(self):
        self.previous: torch.Tensor | None = None  # [batch, vocab] log-probs of the last step
        self.steps: list[torch.Tensor] = []  # [batch] per step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self._read(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _read(self, tokens: torch.Tensor) -> None:
        self.steps.append(self.previous.gather(-1, tokens[:, None]).squeeze(-1))  # stays on the device: no sync

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """``[batch, T]`` log-probs of ``new_tokens`` (the generated part of the sequences)."""
        length = new_tokens.shape[1]
        if len(self.steps) < length:
            self._read(new_tokens[:, len(self.steps)].to(self.previous.device))
        return torch.stack(self.steps[:length], dim=1).cpu()


class TransformersEngine:
    """A ``RolloutEngine`` over ``transformers`` ``generate``.

    Args:
        max_batch: prompts x answers generated per ``generate`` call (bounds memory).
        compile: a static KV cache, whose decoding step transformers compiles (``inference_model.compile``);
            prompts are left-padded to a multiple of :attr:`PAD_MULTIPLE` so that few shapes compile.
    """

    PAD_MULTIPLE = 64

    shares_weights = False
    """Whether the model is the learner's own (``update_weights`` has nothing to do)."""

    def __init__(
        self,
        model_path: str | None,
        device: torch.device,
        *,
        dtype: str = "float32",
        max_batch: int = 64,
        model: torch.nn.Module | None = None,
        tokenizer=None,
        compile: bool = False,
        **_,
    ):
        self.device = device
        self.compile = compile
        self.autocast = False
        if model is None:
            self.model = load_causal_lm(model_path, device, dtype, trainable=False)
            self.model.config.use_cache = True
        else:
            self.model = model
            param_dtype = next(model.parameters()).dtype
            self.autocast = dtype == "bfloat16" and param_dtype != torch.bfloat16
        tok = tokenizer if tokenizer is not None else load_tokenizer(model_path)
        self.tokenizer = tok
        self.pad_id = tok.pad_token_id
        self.eos_ids = {tok.eos_token_id} | set(
            self.model.generation_config.eos_token_id
            if isinstance(self.model.generation_config.eos_token_id, list)
            else [self.model.generation_config.eos_token_id]
        ) - {None}
        self.max_batch = max_batch

    @classmethod
    def sharing(
        cls,
        model: torch.nn.Module,
        tokenizer,
        device: torch.device,
        *,
        dtype: str = "float32",
        max_batch: int = 64,
        **_,
    ) -> TransformersEngine:
        """An engine that generates with ``model``, the learner's own (``inference_model.share_weights``): in eval
        mode and without gradients, under bf16 autocast when ``dtype`` is bfloat16 and the weights are not."""
        engine = cls(None, device, dtype=dtype, max_batch=max_batch, model=model, tokenizer=tokenizer)
        engine.shares_weights = True
        return engine

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSpec) -> TensorDict:
        responses: list[list[int]] = []
        logprobs: list[list[float]] = []
        truncated: list[bool] = []
        per_call = max(1, self.max_batch // n)
        training = self.model.training
        self.model.eval()  # a shared learner's model: no dropout, and no gradient checkpointing against the cache
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16) if self.autocast else nullcontext()
        try:
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []), autocast:
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed)
                for start in range(0, len(prompts), per_call):
                    chunk = prompts[start : start + per_call]
                    self._generate_chunk(chunk, n, sampling, responses, logprobs, truncated)
        finally:
            self.model.train(training)
        return pack_rollouts(prompts, responses, logprobs, truncated, n, self.pad_id)

    def stream(
        self, requests: Iterable[GroupRequest], n: int, sampling: SamplingSpec, max_in_flight: int
    ) -> Iterator[tuple[int, TensorDict]]:
        """One ``generate`` call finishes its groups together: up to ``max_in_flight`` requests per call."""
        return stream_by_calls(self.generate, requests, n, sampling, max_in_flight)

    def _generate_chunk(self, chunk, n, sampling, responses, logprobs, truncated) -> None:
        lp = max(len(p) for p in chunk)
        if self.compile:
            lp = -(-lp // self.PAD_MULTIPLE) * self.PAD_MULTIPLE
        ids = torch.full((len(chunk), lp), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(chunk):
            ids[i, lp - len(p) :] = torch.as_tensor(p)
            mask[i, lp - len(p) :] = 1
        # The warpers are given here, in vLLM's order, with the recorder after them; generate adds none of its own.
        sample = sampling.temperature > 0  # temperature 0 means greedy, as in vLLM
        processors = []
        if sample and sampling.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(sampling.temperature))
        if sample and sampling.top_k > 0:
            processors.append(TopKLogitsWarper(sampling.top_k))
        if sample and sampling.top_p < 1.0:
            processors.append(TopPLogitsWarper(sampling.top_p))
        recorder = SampledLogprobs()
        sequences = self.model.generate(
            input_ids=ids.repeat_interleave(n, 0).to(self.device),
            attention_mask=mask.repeat_interleave(n, 0).to(self.device),
            do_sample=sample,
            # the warpers above do the sampling; greedy decoding takes no sampling flags (transformers warns of each)
            **({"temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {}),
            logits_processor=LogitsProcessorList([*processors, recorder]),
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.eos_ids),
            stop_strings=list(sampling.stop) or None,
            tokenizer=self.tokenizer if sampling.stop else None,
            use_cache=True,
            **({"cache_implementation": "static"} if self.compile else {}),
        )
        new = sequences[:, lp:].cpu()  # [c*n, T]
        token_lp = recorder.finish(new)  # [c*n, T]
        for row in range(new.shape[0]):
            toks = new[row].tolist()
            length, stopped = len(toks), False
            # Decode prefixes only for a row whose text holds a stop string at all (one decode for the others).
            check_stop = bool(sampling.stop) and any(x in self.tokenizer.decode(toks) for x in sampling.stop)
            for t, tok in enumerate(toks):
                if tok in self.eos_ids or (check_stop and self._ends_with_stop(toks[: t + 1], sampling.stop)):
                    length, stopped = t + 1, True  # the stop token (or string) is part of the answer, as in vLLM
                    break
            responses.append(toks[:length])
            logprobs.append(token_lp[row, :length].tolist())
            truncated.append(not stopped)

    def _ends_with_stop(self, ids: list[int], stop: tuple[str, ...]) -> bool:
        """Whether the text of ``ids`` contains a stop string that its last token completed."""
        text = self.tokenizer.decode(ids)
        return any(s in text and s not in self.tokenizer.decode(ids[:-1]) for s in stop)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        if self.shares_weights:
            return  # the learner's own model: it already holds the new weights
        state = {name: t.detach() for name, t in named_tensors}
        self.model.load_state_dict(state, strict=False)

    def shutdown(self) -> None:
        self.model = None  # a shared model stays the learner's
