"""transformers rollout engine: the fallback when vLLM is not installed, and a reference for tests.

It samples with ``model.generate`` on left-padded prompts and reads the sampled tokens' log-probs from the
processed scores (temperature, top-k and top-p applied, in that order), as vLLM's ``processed_logprobs`` does.
It holds its own copy of the model, so ``update_weights`` copies tensors; there is no KV-cache reuse across a
group's answers.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from tensordict import TensorDict

from grpo_rl.models import load_causal_lm, load_tokenizer
from grpo_rl.rollout.base import SamplingSpec, pack_rollouts


class TransformersEngine:
    """A ``RolloutEngine`` over ``transformers`` ``generate``.

    Args:
        model_path: local HF folder.
        device: where the engine's copy of the model lives.
        dtype: ``float32`` or ``bfloat16``.
        max_batch: prompts x answers generated per ``generate`` call (bounds memory).
    """

    def __init__(self, model_path: str, device: torch.device, *, dtype: str = "float32", max_batch: int = 64, **_):
        self.device = device
        self.model = load_causal_lm(model_path, device, dtype, trainable=False)
        self.model.config.use_cache = True
        tok = load_tokenizer(model_path)
        self.tokenizer = tok
        self.pad_id = tok.pad_token_id
        self.eos_ids = {tok.eos_token_id} | set(
            self.model.generation_config.eos_token_id
            if isinstance(self.model.generation_config.eos_token_id, list)
            else [self.model.generation_config.eos_token_id]
        ) - {None}
        self.max_batch = max_batch

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSpec) -> TensorDict:
        responses: list[list[int]] = []
        logprobs: list[list[float]] = []
        truncated: list[bool] = []
        per_call = max(1, self.max_batch // n)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(prompts), per_call):
                chunk = prompts[start : start + per_call]
                self._generate_chunk(chunk, n, sampling, responses, logprobs, truncated)
        return pack_rollouts(prompts, responses, logprobs, truncated, n, self.pad_id)

    def _generate_chunk(self, chunk, n, sampling, responses, logprobs, truncated) -> None:
        lp = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), lp), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(chunk):
            ids[i, lp - len(p):] = torch.as_tensor(p)
            mask[i, lp - len(p):] = 1
        out = self.model.generate(
            input_ids=ids.repeat_interleave(n, 0).to(self.device),
            attention_mask=mask.repeat_interleave(n, 0).to(self.device),
            do_sample=sampling.temperature > 0,  # temperature 0 means greedy, as in vLLM
            temperature=sampling.temperature if sampling.temperature > 0 else None,
            top_p=sampling.top_p if sampling.temperature > 0 else None,
            top_k=sampling.top_k if sampling.temperature > 0 else None,
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.eos_ids),
            stop_strings=list(sampling.stop) or None,
            tokenizer=self.tokenizer if sampling.stop else None,
            output_scores=True,
            return_dict_in_generate=True,
        )
        new = out.sequences[:, lp:].cpu()  # [c*n, T]
        scores = torch.stack(out.scores, dim=1).float().cpu()  # [c*n, T, V]
        token_lp = torch.log_softmax(scores, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)  # [c*n, T]
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

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        state = {name: t.detach() for name, t in named_tensors}
        self.model.load_state_dict(state, strict=False)

    def shutdown(self) -> None:
        self.model = None
