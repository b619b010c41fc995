"""A single-turn prompt -> answer -> reward environment with torchrl's reset/step TensorDict contract.

``reset()`` draws the next ``prompts_per_step`` prompts and returns a TensorDict of batch size ``[P]`` with
their chat-formatted token ids. ``step(td)`` takes the answers (batch ``[P * G]``, answers of one prompt
consecutive, ``group_id`` pointing at the prompt) and writes ``("next", "reward")``, ``("next", "done")`` and
one ``("next", "reward_<component>")`` per reward component, as torchrl's ``EnvBase.step`` does. Episodes
are one step long (a contextual bandit), so ``done`` is always True after ``step``.

Keys written by ``reset`` (batch ``[P]``):
    ``prompt`` (str), ``prompt_tokens`` (list[int]), ``reference`` (task-specific), ``prompt_index`` (int:
    row in the data set), and ``extra`` (dict of the row's other columns, passed to the reward).

The prompt stream is a seeded permutation of the data set, reshuffled every epoch; its position is part of
:meth:`state_dict`, so a resumed run sees the same prompts in the same order.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
import torch
from tensordict import NonTensorStack, TensorDict

from grpo_rl.errors import DataError
from grpo_rl.rewards.base import CompositeReward

log = logging.getLogger(__name__)


class PromptTooLongError(DataError):
    """A prompt exceeds ``env.max_prompt_tokens``."""


class PromptEnv:
    """Prompts from records, formatted with a chat template, scored by a :class:`CompositeReward`.

    Args:
        records: data rows.
        tokenizer: the policy's tokenizer (its chat template formats prompts).
        reward: the reward to apply in :meth:`step`.
        format_messages: row -> chat messages.
        reference_of: row -> what the reward compares against.
        prompts_per_step: ``P``.
        max_prompt_tokens: longer prompts are skipped (``too_long="skip"``) or rejected.
        seed: shuffling seed.
        shuffle: shuffle the data set each epoch.
        too_long: ``"skip"`` or ``"error"``.
        extra_columns: names of row fields passed through to the reward as keyword lists.
    """

    def __init__(
        self,
        records: Sequence[dict],
        tokenizer,
        reward: CompositeReward,
        *,
        format_messages,
        reference_of,
        prompts_per_step: int,
        max_prompt_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        too_long: str = "skip",
        extra_columns: Sequence[str] = (),
        name: str = "prompts",
    ):
        if not records:
            raise DataError(f"{name}: the data set is empty; point env.path at a file with at least one row")
        self.name = name
        self.reward = reward
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self.shuffle = shuffle
        self.extra_columns = tuple(extra_columns)
        self._rows: list[tuple[int, str, list[int], Any, dict]] = []
        skipped = 0
        for i, row in enumerate(records):
            text = tokenizer.apply_chat_template(format_messages(row), add_generation_prompt=True, tokenize=False)
            tokens = tokenizer.encode(text, add_special_tokens=False)
            if len(tokens) > max_prompt_tokens:
                if too_long == "error":
                    raise PromptTooLongError(
                        f"{name}: row {i} has a {len(tokens)}-token prompt, over env.max_prompt_tokens="
                        f"{max_prompt_tokens}; raise env.max_prompt_tokens or set env.too_long_prompts=skip"
                    )
                skipped += 1
                continue
            extra = {k: row.get(k) for k in self.extra_columns}
            self._rows.append((i, text, tokens, reference_of(row), extra))
        if skipped:
            log.warning("%s: skipped %d of %d prompts longer than %d tokens", name, skipped, len(records), max_prompt_tokens)
        if not self._rows:
            raise PromptTooLongError(
                f"{name}: every prompt is longer than env.max_prompt_tokens={max_prompt_tokens}; raise it"
            )
        self.num_skipped = skipped
        self.last_reward_failures: dict = {}
        self.last_failure_examples: list[dict] = []
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def __len__(self) -> int:
        return len(self._rows)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self._rows))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self._rows))

    def _next_rows(self) -> list[tuple[int, str, list[int], Any, dict]]:
        rows = []
        while len(rows) < self.prompts_per_step:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            rows.append(self._rows[self._order[self.position]])
            self.position += 1
        return rows

    def reset(self, td: TensorDict | None = None) -> TensorDict:
        rows = self._next_rows()
        return TensorDict(
            {
                "prompt": NonTensorStack(*[r[1] for r in rows]),
                "prompt_tokens": NonTensorStack(*[r[2] for r in rows]),
                "reference": NonTensorStack(*[r[3] for r in rows]),
                "extra": NonTensorStack(*[r[4] for r in rows]),
                "prompt_index": torch.tensor([r[0] for r in rows]),
                "done": torch.zeros(len(rows), 1, dtype=torch.bool),
            },
            batch_size=[len(rows)],
        )

    def step(self, td: TensorDict) -> TensorDict:
        """Score ``td["response_text"]`` against the references of ``td["group_id"]``'s prompts."""
        responses = list(td["response_text"])
        references = list(td["reference"])
        extra = {}
        if self.extra_columns:
            rows = list(td["extra"])
            extra = {k: [r.get(k) for r in rows] for k in self.extra_columns}
        result = self.reward(responses, references, **extra)
        nxt = TensorDict(
            {"reward": result.total.unsqueeze(-1), "done": torch.ones(len(responses), 1, dtype=torch.bool)},
            batch_size=td.batch_size,
        )
        for name, vals in result.components.items():
            nxt.set(f"reward_{name}", vals.unsqueeze(-1))
        td.set("next", nxt)
        self.last_reward_failures = result.failures
        self.last_failure_examples = result.failure_examples
        return td

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.position = state["position"]
        self._order = self._permutation(self.epoch)
