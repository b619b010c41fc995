"""From prompts to a scored, advantage-annotated batch: the collector and the advantage stage (the reference scorer
between them is :mod:`grpo_rl.training.reference`).

Each stage adds keys to the batch TensorDict (batch size ``[N]``, ``N = P * G``) and rewrites none. A group is
the set of rows sharing a ``group_id`` (:mod:`grpo_rl.engines.base`), the one definition every later stage uses:

=====================  ==========  =================================================
stage                  key         shape / meaning
=====================  ==========  =================================================
engine                 see :mod:`grpo_rl.engines.base`
:class:`Collector`     ``response_text``, ``prompt``, ``reference``   text, for rewards and logging
                       ``reward``  ``[N]`` total task reward
                       ``reward_<name>``  ``[N]`` each reward component, unweighted
                       ``policy_version``  ``[N]`` learner version whose weights sampled it (its
                       oldest token's, where a served engine reports ``behavior_version``)
:class:`~grpo_rl.training.reference.RefScorer`  ``ref_logprobs``  ``[N, Lr]`` reference log-probs of the answer tokens
:func:`assign_advantages`  ``advantage``  ``[N]``; ``zero_variance`` ``[N]`` bool
                       ``reward_overlong``  ``[N]`` DAPO's length shaping, with ``policy.overlong_buffer > 0``
=====================  ==========  =================================================
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from tensordict import NonTensorStack, TensorDict

from grpo_rl import trace
from grpo_rl.engines.base import GroupRequest, Live, RolloutEngine, SamplingSpec, split_groups
from grpo_rl.envs import make_env
from grpo_rl.envs.base import PromptEnv, group_answers, rewards_per_answer
from grpo_rl.envs.multiturn import ToolMessages, ToolUse, pack_episodes, run_episodes
from grpo_rl.placement.context import RunContext


@dataclass
class CollectStats:
    generation_seconds: float = 0.0
    reward_seconds: float = 0.0
    num_tokens: int = 0
    reward_failures: dict = field(default_factory=dict)
    failure_examples: list = field(default_factory=list)
    """The failing reward calls (component, error, answer) of this batch."""


class Collector:
    """Draws prompts from ``env``, samples ``group_size`` answers each with ``engine``, and scores them.

    Args:
        seed: base seed; the request for prompt ``i`` of step ``s`` is seeded from ``(seed, s, i)``.
        tools: with tools and ``max_turns > 1``, each answer is a multi-turn episode in which the model may call them
            (:mod:`grpo_rl.envs.multiturn`); the reward scores its last turn.
        max_total_tokens: the engine's context length (prompt and every turn), for multi-turn episodes.
    """

    def __init__(
        self,
        env: PromptEnv,
        engine: RolloutEngine,
        tokenizer,
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        tools: ToolUse | None = None,
        max_turns: int = 1,
        max_total_tokens: int = 1 << 30,
    ):
        self.env = env
        self.engine = engine
        self.tokenizer = tokenizer
        self.group_size = group_size
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.seed = seed
        self.tools = tools if max_turns > 1 else None
        self.max_turns = max_turns
        self.max_total_tokens = max_total_tokens
        self.tool_messages = ToolMessages(tokenizer) if self.tools is not None else None

    def batch_seed(self, step: int) -> int:
        """The sampling seed of batch ``step`` of the stream; group ``i`` of it is seeded ``batch_seed + i * G``
        (what one ``generate`` of the batch gives its prompt ``i``)."""
        # One seed per (run seed, step): resuming at step s reproduces its samples exactly.
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return int(torch.randint(0, 2**31 - 1, (1,), generator=generator))

    def sampling(self, seed: int | None) -> SamplingSpec:
        return SamplingSpec(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=seed,
        )

    def collect(self, step: int, policy_version: int) -> tuple[TensorDict, CollectStats]:
        """Batch ``step`` of the stream whole: the environment's next ``P`` prompts, ``G`` answers each."""
        t0, w0 = time.perf_counter(), trace.now_us()
        prompts = self.env.reset()
        batch = self._generate(list(prompts["prompt_tokens"]), self.sampling(self.batch_seed(step)))
        t1, w1 = time.perf_counter(), trace.now_us()
        trace.record("generate", w0, w1, track="engine", batch=step, version=policy_version)
        batch = self._score(prompts, batch, policy_version)
        trace.record("reward", w1, trace.now_us(), track="rollout", batch=step)
        return batch, self._stats(batch, t1 - t0, time.perf_counter() - t1)

    def stream(
        self, groups: Iterable[int], prompts: PromptGroups, version: Callable[[], int], max_in_flight: int
    ) -> Iterator[tuple[int, TensorDict, CollectStats]]:
        """Group by group: sample and score group ``g`` of the stream for each ``g`` of ``groups`` (drawn when the
        engine has room for it, see :meth:`~grpo_rl.engines.base.RolloutEngine.stream`) and yield ``(g, group,
        stats)`` as each finishes. Group ``g`` is prompt ``g % P`` of batch ``g // P`` with that batch's seed, so a
        batch's groups are the batch :meth:`collect` makes; each is stamped with ``version()`` when it is drawn
        (``policy_version``) and with ``group_index`` and ``batch_index``. ``stats.generation_seconds``: the time
        spent waiting on the engine for this group (they add up to the engine's wall time). With tools, ``P``
        groups at a time go through :func:`~grpo_rl.envs.multiturn.run_episodes` as one batch."""
        drawn: dict[int, tuple[TensorDict, int]] = {}  # g -> (its prompt row, the version it was drawn with)
        n, P = self.group_size, prompts.per_batch

        pending = iter(groups)

        def draw() -> GroupRequest | None:  # live: `groups` may have nothing now and more once a group finishes
            g = next(pending, None)
            if g is None:
                return None
            row = prompts.row(g)
            drawn[g] = (row, version())
            return GroupRequest(key=g, prompt=row["prompt_tokens"][0], seed=self.batch_seed(g // P) + g % P * n)

        if self.tools is None:
            answers = self.engine.stream(Live(draw), n, self.sampling(None), max_in_flight)
        else:
            answers = self._episode_groups(Live(draw), max_in_flight)
        with contextlib.closing(answers):
            t0, w0 = time.perf_counter(), trace.now_us()
            for g, group in answers:
                t1, w1 = time.perf_counter(), trace.now_us()
                row, drawn_at = drawn.pop(g)
                trace.record("generate", w0, w1, track="engine", group=g, version=drawn_at)
                group = self._score(row, group, drawn_at)
                group.set("group_index", torch.full((n,), g, dtype=torch.long))
                group.set("batch_index", torch.full((n,), g // P, dtype=torch.long))
                t2 = time.perf_counter()
                trace.record("reward", w1, trace.now_us(), track="rollout", group=g)
                yield g, group, self._stats(group, t1 - t0, t2 - t1)
                t0, w0 = time.perf_counter(), trace.now_us()

    def _episode_groups(self, requests: Iterator[GroupRequest], max_in_flight: int) -> Iterator[tuple[int, TensorDict]]:
        """Multi-turn episodes, ``max_in_flight`` groups per call (a call finishes all its episodes at once)."""
        while chunk := list(itertools.islice(requests, max_in_flight)):
            batch = self._generate([r.prompt for r in chunk], self.sampling(chunk[0].seed))
            yield from zip((r.key for r in chunk), split_groups(batch), strict=True)

    def _generate(self, prompt_tokens: list, sampling: SamplingSpec) -> TensorDict:
        """``G`` answers (or multi-turn episodes) for each prompt, with the decoded ``response_text``."""
        n = self.group_size
        if self.tools is None:
            batch = self.engine.generate(prompt_tokens, n, sampling)
            mask = batch["response_mask"]
            answers = [ids[: int(m.sum())] for ids, m in zip(batch["response_ids"], mask, strict=True)]
        else:  # the reward scores each episode's last turn
            decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
            episodes = run_episodes(
                self.engine,
                prompt_tokens,
                n,
                sampling,
                tools=self.tools,
                messages=self.tool_messages,
                decode=decode,
                max_turns=self.max_turns,
                max_total_tokens=self.max_total_tokens,
            )
            batch = pack_episodes(prompt_tokens, episodes, n, pad_id=self.tokenizer.pad_token_id or 0)
            answers = [e.answer_ids for e in episodes]
            # The whole episode as the model saw it (calls, tool messages, answer): what samples.jsonl shows.
            batch.set("episode_text", NonTensorStack(*[self.tokenizer.decode(e.ids) for e in episodes]))
        batch.set("response_text", NonTensorStack(*self.tokenizer.batch_decode(answers, skip_special_tokens=True)))
        return batch

    def _score(self, prompts: TensorDict, batch: TensorDict, policy_version: int) -> TensorDict:
        """``batch``'s answers to ``prompts`` (rows of a reset) decoded, with their prompts' fields and rewards."""
        n = self.group_size
        if "response_text" not in batch.keys():  # a streamed group of single answers
            mask = batch["response_mask"]
            answers = [ids[: int(m.sum())] for ids, m in zip(batch["response_ids"], mask, strict=True)]
            batch.set("response_text", NonTensorStack(*self.tokenizer.batch_decode(answers, skip_special_tokens=True)))
        rows = batch["group_id"].tolist()
        prompts = prompts.clone(False)
        prompts.set("response_text", group_answers(batch.get("response_text"), n, batch["group_id"]))  # [P, G]
        for key in ("prompt", "reference", "extra"):
            values = list(prompts[key])
            batch.set(key, NonTensorStack(*[values[g] for g in rows]))
        batch.set("prompt_index", prompts["prompt_index"][batch["group_id"]])
        for key, val in rewards_per_answer(self.env.score(prompts), batch["group_id"]).items():  # [N]
            batch.set(key, val)
        batch.set("policy_version", oldest_token_version(batch, policy_version))
        return batch

    def _stats(self, batch: TensorDict, generation_seconds: float, reward_seconds: float) -> CollectStats:
        return CollectStats(
            generation_seconds=generation_seconds,
            reward_seconds=reward_seconds,
            num_tokens=int(batch["response_mask"].sum()),
            reward_failures=dict(self.env.last_reward_failures),
            failure_examples=list(self.env.last_failure_examples),
        )


class PromptGroups:
    """The prompt stream, group by group: group ``g`` is prompt ``g % P`` of the environment's ``g // P``-th reset.

    ``env`` stands at the start of batch ``first_batch``; groups are asked for in increasing order (each reset is
    drawn once, when its first group is asked for)."""

    def __init__(self, env: PromptEnv, first_batch: int = 0):
        self.env, self.per_batch = env, env.prompts_per_step
        self._batch, self._prompts = first_batch - 1, None

    def row(self, g: int) -> TensorDict:
        """Prompt ``g``'s row of its reset (a ``[1]`` TensorDict)."""
        b, i = divmod(g, self.per_batch)
        if b < self._batch:
            raise ValueError(f"group {g} of the prompt stream was asked for after batch {self._batch}'s")
        while self._batch < b:
            self._prompts = self.env.reset()
            self._batch += 1
        return self._prompts[i : i + 1]


def oldest_token_version(batch: TensorDict, default: int) -> torch.Tensor:
    """``[N]`` the version of each answer's oldest token (``behavior_version``, from a served engine whose weights
    may change under an answer in flight), else ``default`` for every answer; an empty answer gets ``default``."""
    n = batch.batch_size[0]
    if "behavior_version" not in batch.keys():
        return torch.full((n,), default, dtype=torch.long)
    mask = batch["response_mask"].bool()
    big = torch.iinfo(torch.long).max
    oldest = batch["behavior_version"].masked_fill(~mask, big).amin(dim=-1)  # [N]
    return torch.where(mask.any(dim=-1), oldest, torch.full_like(oldest, default))


def make_collector(run: RunContext, engine, env=None) -> Collector:
    cfg = run.cfg
    # An actor's own copy of the environment: its cfg already holds the driver's train.steps (make_run).
    env = env if env is not None else make_env(cfg, run.tokenizer, devices=run.devices, rewards=run.rewards)
    return Collector(
        env,
        engine,
        run.tokenizer,
        group_size=cfg.env.group_size,
        max_new_tokens=cfg.sampling.max_new_tokens,
        temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p,
        top_k=cfg.sampling.top_k,
        seed=cfg.seed,
        tools=env.tool_use,
        max_turns=cfg.env.max_turns,
        max_total_tokens=cfg.inference_model.max_model_len,
    )
