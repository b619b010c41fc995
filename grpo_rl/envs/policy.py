"""A rollout engine as a torchrl policy, for ``env.rollout`` over a :class:`~grpo_rl.envs.base.PromptEnv`.

The training loop's collector (:mod:`grpo_rl.rollout.collector`) drives the engine and the environment itself; this is
the torchrl route to the same data::

    policy = EnginePolicy(engine, tokenizer, group_size=8, sampling=SamplingSpec(max_new_tokens=256))
    td = env.rollout(1, policy)  # [P, 1]: prompts, answers [P, 1, G], ("next", "reward") [P, 1, G, 1]
"""

from __future__ import annotations

from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from grpo_rl.engines.base import RolloutEngine, SamplingSpec
from grpo_rl.envs.base import group_answers


class EnginePolicy(TensorDictModuleBase):
    """Reads ``prompt_tokens`` ``[P]``, samples ``group_size`` answers per prompt with ``engine`` and writes them
    as the ``response_text`` action ``[P, G]``, with the engine's batch reshaped to ``[P, G]`` as ``generation``;
    ``sampling`` is used as given, seed included."""

    in_keys = ["prompt_tokens"]
    out_keys = ["response_text", "generation"]

    def __init__(self, engine: RolloutEngine, tokenizer, *, group_size: int, sampling: SamplingSpec):
        super().__init__()
        self.engine = engine
        self.tokenizer = tokenizer
        self.group_size = group_size
        self.sampling = sampling

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        prompts = tensordict.get("prompt_tokens").tolist()
        batch = self.engine.generate(prompts, self.group_size, self.sampling)
        texts = self.tokenizer.batch_decode(
            [ids[: int(m.sum())] for ids, m in zip(batch["response_ids"], batch["response_mask"], strict=True)],
            skip_special_tokens=True,
        )
        tensordict.set("response_text", group_answers(texts, self.group_size))
        tensordict.set("generation", batch.reshape(len(prompts), self.group_size))
        return tensordict
