"""A single-turn prompt -> answers -> reward environment, as a torchrl :class:`~torchrl.envs.EnvBase`.

One environment step is one round of GRPO sampling: ``reset()`` draws the next ``prompts_per_step`` prompts and
``step(td)`` scores the group of answers the policy wrote for each. The environment's batch is the prompts
(``batch_size=[P]``, batch-locked); the group is the action's second dimension, ``G`` free from step to step (a
dynamic spec dimension), so training (``G = env.group_size``), greedy evaluation (``G = 1``) and pass@k sampling
share one environment. (torchrl's own ``DatasetChatEnv`` instead repeats each prompt ``G`` times along a flat
batch, which fixes ``G`` when the environment is built.) Episodes are one step long (a contextual bandit):
``done`` and ``terminated`` are True after every ``step``.

Keys (``P`` prompts, ``G`` answers each; text and token lists are :class:`~torchrl.data.NonTensor` data):

==========================  ======  ==========  ========================================================
key                         spec    shape       meaning
==========================  ======  ==========  ========================================================
``prompt``                  obs     [P]         the chat-formatted prompt (str)
``prompt_tokens``           obs     [P]         its token ids (list[int]), what an engine samples from
``prompt_index``            obs     [P]         int64 row of the prompt in the data set
``reference``               state   [P]         what the reward compares against (task-specific)
``extra``                   state   [P]         dict of the row's ``extra_columns``, passed to the reward
``response_text``           action  [P, G]      the answers (str), answers of prompt ``p`` in row ``p``
``("next", "reward")``      reward  [P, G, 1]   float32 total reward of each answer
``("next", "reward_<c>")``  reward  [P, G, 1]   each reward component, unweighted
``done``, ``terminated``    done    [P, 1]      bool
==========================  ======  ==========  ========================================================

torchrl's own tooling applies: :func:`~torchrl.envs.utils.check_env_specs`, ``env.rollout(1, policy)`` with a
policy that writes ``response_text`` (:class:`~grpo_rl.envs.policy.EnginePolicy` wraps a rollout engine), and
transforms (``TransformedEnv(env, RewardScaling(...))``). The training collector calls the same ``reset``/``step``,
groups the engine's rows with :func:`group_answers` and puts the rewards back on them with
:func:`rewards_per_answer` (both by ``group_id``). torchrl's base class adds well under a millisecond to a
reset + step, against seconds per training step, since it checks no data against the specs (measured; see
``benchmarks/micro/env_overhead.py``).

The prompt stream is a seeded permutation of the data set, reshuffled every epoch; its position is what
:meth:`PromptEnv.state_dict` holds, so a resumed run sees the same prompts in the same order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase
from torchrl.data import Categorical, Composite, NonTensor, Unbounded
from torchrl.envs import EnvBase

from grpo_rl.envs.prompt_tokens import tokenize_prompts
from grpo_rl.envs.rewards.base import CompositeReward
from grpo_rl.errors import DataError

if TYPE_CHECKING:
    from grpo_rl.envs.multiturn import ToolUse

log = logging.getLogger(__name__)

OBSERVATION_KEYS = ("prompt", "prompt_tokens", "prompt_index")
"""What ``reset`` shows the policy, carried unchanged into ``"next"`` (the episode ends after one step)."""


class PromptTooLongError(DataError):
    """A prompt exceeds ``env.max_prompt_tokens``."""


def _group_order(group_id: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """The row order that puts each prompt's answers together (prompt ``0``'s first, each group's rows in their
    order); None when the rows are in that order already. Checks that every prompt ``0 .. P-1`` has
    ``group_size`` answers."""
    order = torch.argsort(group_id, stable=True)
    ids = group_id[order]
    n = ids.numel()
    if (
        group_size < 1
        or n % group_size
        or not torch.equal(ids.view(-1, group_size), torch.arange(n // group_size).unsqueeze(-1).expand(-1, group_size))
    ):
        raise ValueError(f"group_id does not give each of its prompts {group_size} answers")
    return None if torch.equal(order, torch.arange(n)) else order


def group_answers(
    answers: Sequence[str] | NonTensorStack, group_size: int, group_id: torch.Tensor | None = None
) -> NonTensorStack:
    """``P * G`` ``answers`` (one per row; a flat ``NonTensorStack`` is reshaped, its entries shared) as the
    ``[P, G]`` ``response_text`` action; ``group_id`` gives each row's prompt (None: consecutive, prompt-major)."""
    stack = answers if isinstance(answers, NonTensorStack) else NonTensorStack(*answers)
    n = stack.batch_size[0] if stack.batch_dims else 0
    if group_size < 1 or n == 0 or n % group_size:
        raise ValueError(f"{n} answers do not split into groups of {group_size}")
    order = None if group_id is None else _group_order(group_id, group_size)
    if order is not None:
        stack = stack[order]
    return stack.reshape(n // group_size, group_size)


def rewards_per_answer(next_td: TensorDictBase, group_id: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``reward`` and every ``reward_<component>`` of a step's ``"next"`` (``[P, G, 1]``), one value per answer
    (``[P * G]``): in the rows of ``group_id`` (the rows given to :func:`group_answers`), or prompt-major."""
    values = {
        key: val.reshape(-1)
        for key, val in next_td.items()
        if isinstance(key, str) and (key == "reward" or key.startswith("reward_"))
    }
    g = next_td.get("reward").shape[1]
    order = None if group_id is None else _group_order(group_id, g)
    if order is None:
        return values
    return {key: torch.empty_like(val).index_copy_(0, order, val) for key, val in values.items()}


def _rows(td: TensorDictBase, key: str) -> list:
    """The non-tensor ``key`` of ``td`` as a list with one entry per prompt."""
    value = td.get(key)
    return value.tolist() if hasattr(value, "tolist") else list(value)


class PromptEnv(EnvBase):
    """Prompts from records, formatted with a chat template, whose answers a :class:`CompositeReward` scores.

    Args:
        format_messages: row -> chat messages.
        reference_of: row -> what the reward compares against.
        prompts_per_step: ``P``, the batch size; setting ``env.prompts_per_step`` later rebuilds the specs.
        max_prompt_tokens: longer prompts are skipped (``too_long="skip"``) or rejected (``"error"``).
        extra_columns: names of row fields passed through to the reward as keyword lists.
        tool_use: the tools the model may call in multi-turn episodes (with ``env.max_turns > 1``); None: none.
    """

    def __init__(
        self,
        records: Sequence[dict],
        tokenizer,
        reward: CompositeReward,
        *,
        format_messages: Callable[[dict], list[dict]],
        reference_of: Callable[[dict], Any],
        prompts_per_step: int,
        max_prompt_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        too_long: str = "skip",
        extra_columns: Sequence[str] = (),
        tool_use: ToolUse | None = None,
        name: str = "prompts",
    ):
        if not records:
            raise DataError(f"{name}: the data set is empty; point env.path at a file with at least one row")
        extra_columns = tuple(extra_columns)
        rows: list[tuple[int, str, list[int], Any, dict]] = []
        skipped = 0
        texts = [
            tokenizer.apply_chat_template(format_messages(row), add_generation_prompt=True, tokenize=False)
            for row in records
        ]
        for i, (row, text, tokens) in enumerate(zip(records, texts, tokenize_prompts(tokenizer, texts), strict=True)):
            if len(tokens) > max_prompt_tokens:
                if too_long == "error":
                    raise PromptTooLongError(
                        f"{name}: row {i} has a {len(tokens)}-token prompt, over env.max_prompt_tokens="
                        f"{max_prompt_tokens}; raise env.max_prompt_tokens or set env.too_long_prompts=skip"
                    )
                skipped += 1
                continue
            rows.append((i, text, tokens, reference_of(row), {k: row.get(k) for k in extra_columns}))
        if skipped:
            log.warning(
                "%s: skipped %d of %d prompts longer than %d tokens", name, skipped, len(records), max_prompt_tokens
            )
        if not rows:
            raise PromptTooLongError(
                f"{name}: every prompt is longer than env.max_prompt_tokens={max_prompt_tokens}; raise it"
            )
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step={prompts_per_step} must be at least 1")
        super().__init__(batch_size=torch.Size([prompts_per_step]))
        self.name = name
        self.reward = reward
        self.seed = seed
        self.shuffle = shuffle
        self.extra_columns = extra_columns
        self.tool_use = tool_use
        self.num_records = len(records)
        self.num_skipped = skipped
        self._rows = rows
        self.last_reward_failures: dict = {}
        self.last_failure_examples: list[dict] = []
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)
        self._prompts_per_step = prompts_per_step
        self._spec_components: tuple[str, ...] = ()
        self.update_specs()

    # -- specs ---------------------------------------------------------------------------------------------------

    @property
    def prompts_per_step(self) -> int:
        """``P``: prompts per ``reset``, the environment's batch size."""
        return self._prompts_per_step

    @prompts_per_step.setter
    def prompts_per_step(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"prompts_per_step={value} must be at least 1")
        if value != self._prompts_per_step:
            self._prompts_per_step = int(value)
            self.update_specs()

    def update_specs(self) -> None:
        """Build the specs for ``P = prompts_per_step`` and the reward's current components; call it after changing
        the components in place, before ``check_env_specs`` or wrapping the environment in a ``TransformedEnv``
        (which caches the specs it transforms)."""
        p = self._prompts_per_step
        first = self._rows[0]
        self._spec_components = self._reward_keys()
        locked = self.is_spec_locked
        self.set_spec_lock_(False)
        # rebuilt whole, as EnvBase builds its empty specs, since the batch size changes with them
        self.__dict__["_batch_size"] = torch.Size([p])

        def per_answer() -> Unbounded:  # [P, G, 1], G set by each step's action
            return Unbounded(shape=(p, -1, 1), dtype=torch.float32)

        observation = Composite(
            prompt=NonTensor(shape=(p,), example_data=first[1]),
            prompt_tokens=NonTensor(shape=(p,), example_data=first[2]),
            prompt_index=Categorical(self.num_records, shape=(p,), dtype=torch.int64),
            shape=(p,),
        )
        reward = Composite(
            {"reward": per_answer(), **{f"reward_{n}": per_answer() for n in self._spec_components}}, shape=(p,)
        )
        done = Composite(
            done=Categorical(2, shape=(p, 1), dtype=torch.bool),
            terminated=Categorical(2, shape=(p, 1), dtype=torch.bool),
            shape=(p,),
        )
        self.__dict__["_output_spec"] = Composite(
            full_observation_spec=observation, full_reward_spec=reward, full_done_spec=done, shape=(p,)
        )
        state = Composite(
            reference=NonTensor(shape=(p,), example_data=first[3]),
            extra=NonTensor(shape=(p,), example_data=first[4]),
            shape=(p,),
        )
        action = Composite(response_text=NonTensor(shape=(p, -1), example_data=""), shape=(p,))
        self.__dict__["_input_spec"] = Composite(full_state_spec=state, full_action_spec=action, shape=(p,))
        self._cache.clear()
        if locked:
            self.set_spec_lock_(True)

    def _reward_keys(self) -> tuple[str, ...]:
        """The ``reward_<name>`` keys a step writes: one per component, and ``unscaled`` (the weighted sum before
        ``reward.scale`` and ``reward.bias``) when those change it."""
        unscaled = ("unscaled",) if self.reward.rescales else ()
        return (*(c.name for c in self.reward.components), *unscaled)

    # -- the prompt stream ---------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Prompts in the data set, over-long ones skipped."""
        return len(self._rows)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self._rows))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self._rows))

    def _next_rows(self) -> list[tuple[int, str, list[int], Any, dict]]:
        rows = []
        while len(rows) < self._prompts_per_step:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            rows.append(self._rows[self._order[self.position]])
            self.position += 1
        return rows

    # -- EnvBase -------------------------------------------------------------------------------------------------

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDict:
        """Draw the next ``P`` prompts (every reset draws a full batch: the episodes all end together)."""
        if self._reward_keys() != self._spec_components:
            self.update_specs()  # components added after construction get their reward_<c> specs
        rows = self._next_rows()
        p = len(rows)
        return TensorDict(
            {
                "prompt": NonTensorStack(*[r[1] for r in rows]),
                "prompt_tokens": NonTensorStack(*[r[2] for r in rows]),
                "reference": NonTensorStack(*[r[3] for r in rows]),
                "extra": NonTensorStack(*[r[4] for r in rows]),
                "prompt_index": torch.tensor([r[0] for r in rows], dtype=torch.int64),
                "done": torch.zeros(p, 1, dtype=torch.bool),
                "terminated": torch.zeros(p, 1, dtype=torch.bool),
            },
            batch_size=[p],
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDict:
        """Score each prompt's group of ``response_text`` answers against its ``reference``."""
        return self.score(tensordict)

    def score(self, tensordict: TensorDictBase) -> TensorDict:
        """What :meth:`step` returns under ``"next"``, for any number of prompts (the rows of one reset or a few of
        them: a streaming collector scores each group as it finishes)."""
        groups = [[a] if isinstance(a, str) else list(a) for a in _rows(tensordict, "response_text")]
        p, g = len(groups), len(groups[0]) if groups else 0
        if any(len(answers) != g for answers in groups):
            raise ValueError(
                f"response_text holds groups of {sorted({len(a) for a in groups})} answers; every prompt "
                "needs the same number (build it with group_answers)"
            )
        responses = [a for answers in groups for a in answers]
        references = [ref for ref in _rows(tensordict, "reference") for _ in range(g)]
        extra: dict[str, list] = {}
        if self.extra_columns:
            rows = [row for row in _rows(tensordict, "extra") for _ in range(g)]
            extra = {k: [r.get(k) for r in rows] for k in self.extra_columns}
        result = self.reward(responses, references, **extra)
        shape = (p, g, 1)
        out = TensorDict(
            {
                "reward": result.total.reshape(shape),
                "done": torch.ones(p, 1, dtype=torch.bool),
                "terminated": torch.ones(p, 1, dtype=torch.bool),
            },
            batch_size=[p],
        )
        for name, vals in result.components.items():
            out.set(f"reward_{name}", vals.reshape(shape))
        if result.unscaled is not None:
            out.set("reward_unscaled", result.unscaled.reshape(shape))
        for key in OBSERVATION_KEYS:
            if key in tensordict.keys():
                out.set(key, tensordict.get(key))
        self.last_reward_failures = result.failures
        self.last_failure_examples = result.failure_examples
        return out

    def _set_seed(self, seed: int | None) -> None:
        """Restart the prompt stream in the order of ``seed`` (None: leave it as it is)."""
        if seed is not None:
            self.load_state_dict({"epoch": 0, "position": 0, "seed": int(seed)})

    # -- checkpointing -------------------------------------------------------------------------------------------

    def get_extra_state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def set_extra_state(self, state: Mapping) -> None:
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.position = state["position"]
        self._order = self._permutation(self.epoch)

    def state_dict(self, *args, **kwargs) -> dict:
        """The prompt stream's position (``epoch``, ``position``, ``seed``). With arguments (as a submodule), as
        :meth:`torch.nn.Module.state_dict`, which holds the position as the module's extra state."""
        if args or kwargs:
            return super().state_dict(*args, **kwargs)
        return self.get_extra_state()

    def load_state_dict(self, state_dict: Mapping, *args, **kwargs):
        """Resume the prompt stream from :meth:`state_dict` (other keys in ``state_dict`` are ignored)."""
        if "epoch" not in state_dict:
            return super().load_state_dict(state_dict, *args, **kwargs)
        self.set_extra_state(state_dict)
