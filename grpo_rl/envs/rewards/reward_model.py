"""A learned reward model as a reward component: a local ``AutoModelForSequenceClassification`` with one output.

The model scores (prompt, response) pairs, batched, on its own device (the ``reward_model`` role of
:mod:`grpo_rl.placement.devices`), and its raw scalar output is the component's value. GRPO normalises rewards within
each group, so the score's scale and offset do not matter; its weight against rule-based components does.

The pair is formatted with the reward model's own chat template (user: prompt, assistant: response) when its
tokenizer has one, else as ``prompt + "\\n\\n" + response``. The prompt comes from the keyword column named by
``prompt_column`` (the environments pass the raw prompt); without it the response is scored alone. Inputs over
``max_length`` tokens are cut from the left, so the end of the response, which decides most preferences,
is always seen.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from grpo_rl.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["RewardModelScorer", "build_tiny_reward_model"]


class RewardModelScorer:
    """A reward function ``(responses, references, **columns) -> list[float]`` backed by a reward model.

    Args:
        path: local HF folder with a sequence-classification model (``num_labels=1``) and its tokenizer.
        prompt_column: the keyword column holding each response's prompt (a string or chat messages).
        max_length: token limit of one (prompt, response) input; longer ones lose their start.
    """

    def __init__(
        self,
        path: str,
        device: torch.device,
        *,
        prompt_column: str | None = "prompt",
        batch_size: int = 16,
        max_length: int = 1024,
        dtype: str = "float32",
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForSequenceClassification.from_pretrained(path, dtype=getattr(torch, dtype))
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"reward.model_path={path}: cannot load a sequence-classification model and its "
                f"tokenizer from it ({type(e).__name__}: {e})"
            ) from e
        if model.config.num_labels != 1:
            raise ConfigError(
                f"reward.model_path={path}: the model has num_labels={model.config.num_labels}; a "
                "reward model outputs one score per input (num_labels=1)"
            )
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # Sequence classifiers read the score at the last non-pad token, so they must know the pad id.
        if model.config.pad_token_id is None:
            model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = model.to(device).eval().requires_grad_(False)
        self.device = device
        self.prompt_column = prompt_column
        self.batch_size = batch_size
        self.max_length = max_length
        self.__name__ = "reward_model"
        self._warned_no_prompt = False

    def format_pair(self, prompt: Any, response: str) -> str:
        """The text the reward model scores for one (prompt, response)."""
        if prompt is None:
            messages = []
        elif isinstance(prompt, list):
            messages = list(prompt)
        else:
            messages = [{"role": "user", "content": str(prompt)}]
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(
                messages + [{"role": "assistant", "content": response}], tokenize=False
            )
        return f"{messages[-1]['content']}\n\n{response}" if messages else response

    @torch.no_grad()
    def __call__(self, responses: Sequence[str], references: Sequence[Any], **columns: Sequence[Any]) -> list[float]:
        prompts = columns.get(self.prompt_column) if self.prompt_column else None
        if prompts is None:
            if not self._warned_no_prompt:
                log.warning(
                    "reward model: no %r column reaches the reward; scoring responses without their prompts",
                    self.prompt_column,
                )
                self._warned_no_prompt = True
            prompts = [None] * len(responses)
        texts = [self.format_pair(p, r) for p, r in zip(prompts, responses, strict=True)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[start : start + self.batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                add_special_tokens=False,
                return_tensors="pt",
            )
            logits = self.model(**enc.to(self.device)).logits  # [b, 1]
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores


def build_tiny_reward_model(
    tokenizer_path: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
) -> Path:
    """Write a tiny random Llama reward model (num_labels=1) with a real tokenizer to ``out_dir`` (tests, smoke
    runs); the counterpart of :func:`grpo_rl.model.loading.build_tiny_model`."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=2048,
        num_labels=1,
        pad_token_id=pad,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(config)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir
