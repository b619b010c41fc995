"""The run context: what every role of a run shares, and where each role runs.

Built once at start-up (:func:`grpo_rl.run.setup.make_run`) from the config, it is the bottom layer of the
wiring: it imports no factory, actor or loop. For every role it holds a :class:`RolePlacement`: the devices, the
torch threads of each worker process, whether the workers are Ray actors or the driver itself, and the Ray
resources an actor asks for. Actors receive their slice (:class:`ActorSpec`) and rebuild a :class:`RunContext`
from it; nothing below allocates devices or sets threads again.

Roles and where they run:

==============  =====================================  ============================================
role            sync (``sota/grpo.py``)                 async (``sota/grpo-async.py``)
==============  =====================================  ============================================
collector       the driver (one engine; its vLLM       one actor per ``inference_model`` device
                servers on devices of their own)       (or per server with ``urls``)
learner         the driver; ranks as actors when       the same
                ``train_model.num_devices > 1``
reference       the driver, or one actor per           the same (``ref_model.placement``)
                ``ref_model`` device
reward_model    inside the collector                   inside each collector actor, on its device
==============  =====================================  ============================================

Engines: an in-process engine lives in the learner's process, so it must share the learner's device: in the
synchronous loop a vLLM engine on any other device runs as a server (:func:`engine_is_served`), a process that sees
only its own device, so neither the engine nor the learner can land on the other's GPU. ``engine=vllm_server`` asks
for servers in both loops; in the asynchronous loop each collector actor then drives its own server.

Threads: when roles compute at the same time, more torch threads than cores in total make OpenMP's barriers
stall and small matmuls many times slower (measured; see benchmarks/micro/busy_neighbour.py). In the synchronous loop
the roles in the driver take turns and use every core; workers that compute at once (learner ranks, reference
replicas, and in the asynchronous loop the collectors next to the learner) split the cores between them, one
thread at least.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from grpo_rl import ONEDNN_DEFAULTS, OPENMP_DEFAULTS, trace
from grpo_rl.config.schema import needs_reference_model, uses_reference
from grpo_rl.model.precision import Precision, resolve_precision
from grpo_rl.placement.devices import DeviceAllocation, available_cpus

# Forwarded to every actor, so that actors on other nodes see the same offline/data/cache settings. No secret
# belongs here: a runtime_env is stored in Ray's GCS; the engine key goes only to the actors that need it
# (``ray_options(env=...)``).
FORWARDED_ENV = (
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_HOME",
    "GRPO_DATA_DIR",
    "GRPO_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "VLLM_CPU_KVCACHE_SPACE",
    "WANDB_MODE",
    "PYTHONPATH",
    "GRPO_VERBOSE",
    "GOMP_SPINCOUNT",
    "KMP_BLOCKTIME",
    *OPENMP_DEFAULTS,
    *ONEDNN_DEFAULTS,
)


@dataclass(frozen=True)
class RolePrecisions:
    """The resolved compute precision of each role (``precision: auto`` decided from the hardware)."""

    train: Precision
    ref: Precision
    inference: Precision

    def describe(self) -> str:
        roles = (("train", self.train), ("ref", self.ref), ("inference", self.inference))
        same = len({(p.dtype, p.reason) for _, p in roles}) == 1
        if same:
            return f"{self.train.dtype} for every role ({self.train.reason})"
        return "; ".join(f"{name} {p.dtype} ({p.reason})" for name, p in roles)


def resolve_run_precision(cfg, devices: DeviceAllocation) -> RolePrecisions:
    """Each role's ``precision`` setting on its first device."""
    ref_device = devices.ref[0] if devices.ref else devices.train[0]
    return RolePrecisions(
        train=resolve_precision(cfg.train_model.precision, devices.train[0]),
        ref=resolve_precision(cfg.ref_model.precision, ref_device),
        inference=resolve_precision(cfg.inference_model.precision, devices.inference[0]),
    )


@dataclass(frozen=True)
class RolePlacement:
    """Where one role's workers run: one device per worker (CPU workers repeat ``cpu``) and its torch threads, in
    Ray actors or (``actors=False``) in the driver process."""

    role: str
    devices: tuple[torch.device, ...]
    threads: int
    actors: bool
    gpu_fraction: float = 1.0
    """The share of its GPU each actor asks Ray for: below 1 where actors of several roles share a GPU."""

    @property
    def count(self) -> int:
        return len(self.devices)

    def ray_options(self, *, env: Mapping[str, str] | None = None, **extra: Any) -> dict[str, Any]:
        """``ray.remote(cls).options(...)`` for one of this role's actors: its share of one GPU on a GPU machine
        (Ray then exposes it as ``cuda:0``), else ``threads`` CPUs; ``env``: variables for this actor only, on top of
        :data:`FORWARDED_ENV`."""
        env = {**{k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}, **(env or {})}
        env.update(
            OMP_NUM_THREADS=str(self.threads),
            MKL_NUM_THREADS=str(self.threads),
            TOKENIZERS_PARALLELISM="false",
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            RAY_DEDUP_LOGS="0",
        )
        resources: dict[str, Any] = {"num_cpus": self.threads}
        if self.devices[0].type == "cuda":
            resources = {"num_cpus": 1, "num_gpus": self.gpu_fraction}
        return {**resources, "runtime_env": {"env_vars": env}, **extra}


@dataclass(frozen=True)
class Placement:
    """Every role's :class:`RolePlacement`, and the driver's threads."""

    collector: RolePlacement
    learner: RolePlacement
    reference: RolePlacement | None
    """None when no reference model runs (no KL penalty, or LoRA: the learner's model with adapters off)."""
    reward_model: RolePlacement | None
    driver_threads: int
    served: bool = False
    """The engines are vLLM servers (processes of their own), not in the collector's process."""

    def roles(self) -> list[RolePlacement]:
        return [p for p in (self.collector, self.reference, self.learner, self.reward_model) if p is not None]

    @property
    def uses_ray(self) -> bool:
        return any(p.actors for p in self.roles())

    @property
    def ray_cpus(self) -> int:
        """Logical CPUs the actors ask for in total (a local Ray instance gets at least that many)."""
        return sum(p.count * p.threads for p in self.roles() if p.actors and p.devices[0].type != "cuda")

    @property
    def actor_gpus(self) -> list[torch.device]:
        """The GPUs of roles that run as actors (a local Ray instance is given exactly these)."""
        return [d for p in self.roles() if p.actors for d in p.devices if d.type == "cuda"]

    def describe(self) -> str:
        """The placement table of the start-up log."""
        lines = [f"  {'role':<13}{'where':<26}{'devices':<28}threads"]
        for p in self.roles():
            if p.role == "reward_model":
                where = "in each collector"
            elif p.role == "collector" and self.served:
                where = f"{p.count} vLLM server{'s' if p.count > 1 else ''}" + (" + actors" if p.actors else "")
            elif p.actors:
                where = f"{p.count} Ray actor{'s' if p.count > 1 else ''}"
            else:
                where = "driver process"
            devices = ", ".join(str(d) for d in p.devices)
            lines.append(f"  {p.role:<13}{where:<26}{devices:<28}{p.threads}")
        return "\n".join(lines)


def cpu_cores() -> int:
    """Cores torch may use: ``OMP_NUM_THREADS`` if set, else the cores this process may run on
    (:func:`~grpo_rl.placement.devices.available_cpus`)."""
    return int(os.environ.get("OMP_NUM_THREADS") or available_cpus())


def engine_is_served(cfg, devices: DeviceAllocation, mode: str) -> bool:
    """Whether the rollout engines are vLLM servers: ``engine=vllm_server``, or in the synchronous loop a vLLM
    engine that does not share the learner's device."""
    engine = cfg.inference_model.engine
    if engine == "vllm_server":
        return True
    if engine != "vllm" or mode != "sync" or cfg.simulate.enabled:
        return False
    # in-process, vLLM would set up CUDA for the whole process
    return devices.inference[0] != devices.train[0] or devices.inference[0] not in (
        torch.device("cpu"),
        torch.device("cuda", 0),
    )


def plan_placement(cfg, devices: DeviceAllocation, mode: str, *, cores: int | None = None) -> Placement:
    """Decide where every role runs and with how many threads (module docstring), for the allocation ``devices``
    of :func:`~grpo_rl.placement.devices.allocate_devices`, sharing ``cores`` (default :func:`cpu_cores`)."""
    cores = cores or cpu_cores()
    uses_ref = needs_reference_model(cfg)
    ref_actors = uses_ref and reference_as_actors(cfg, devices, mode)
    learner_actors = len(devices.train) > 1
    # Workers that compute at the same time: they split the cores.
    if mode == "async":
        busy = len(devices.inference) + len(devices.train) + (len(devices.ref) if ref_actors else 0)
    else:  # roles take turns; only a role's own workers (ranks, replicas) compute at once
        busy = max(len(devices.train) if learner_actors else 1, len(devices.ref) if ref_actors else 1)
    shared = max(1, cores // max(1, busy))
    collector = RolePlacement(
        "collector", devices.inference, shared if mode == "async" else cores, actors=mode == "async"
    )
    learner = RolePlacement(
        "learner", devices.train, shared if (mode == "async" or learner_actors) else cores, actors=learner_actors
    )
    reference = None
    if uses_ref:
        threads = shared if ref_actors or mode == "async" else cores
        reference = RolePlacement("reference", devices.ref, threads, actors=ref_actors)
    reward_model = None
    if devices.reward_model:
        reward_model = RolePlacement("reward_model", devices.reward_model, collector.threads, actors=False)
    driver = learner.threads if not learner_actors else (shared if mode == "async" else cores)
    collector, learner, reference = _share_gpus(collector, learner, reference)
    return Placement(
        collector=collector,
        learner=learner,
        reference=reference,
        reward_model=reward_model,
        driver_threads=driver,
        served=engine_is_served(cfg, devices, mode),
    )


def _share_gpus(*roles: RolePlacement | None) -> list[RolePlacement | None]:
    """Give each actor role its share of a GPU that actors of several roles hold (one GPU for every role)."""
    holders = Counter(d for p in roles if p is not None and p.actors for d in set(p.devices) if d.type == "cuda")
    shared = []
    for p in roles:
        most = max((holders.get(d, 1) for d in p.devices), default=1) if p is not None and p.actors else 1
        # Ray places an actor only where the GPU share it asks for is free
        shared.append(p if most == 1 else replace(p, gpu_fraction=1.0 / most))
    return shared


def reference_as_actors(cfg, devices: DeviceAllocation, mode: str) -> bool:
    """Whether the reference runs as a pipeline stage of its own (one actor per device), by ``ref_model.placement``
    (``actor``, ``learner``: in the driver, or ``auto``)."""
    placement = cfg.ref_model.placement
    if placement == "auto":
        # The stage where it overlaps with the other roles (the asynchronous loop: it pays even on shared cores,
        # measured in benchmarks/README.md), has GPUs of its own or shards; in the synchronous loop on shared
        # devices the roles take turns anyway and a stage would only add a transfer.
        own_gpus = devices.on_gpu and not set(devices.ref) & set(devices.train)
        return mode == "async" or own_gpus or len(devices.ref) > 1
    return placement == "actor"


@dataclass(frozen=True)
class RunContext:
    """What every component of a run shares: the config, the devices and where each role runs, the precisions,
    the model and tokenizer; read-only, as its config is (a part that needs other settings copies it)."""

    cfg: Any
    run_dir: Path
    devices: DeviceAllocation
    model_path: str
    tokenizer: Any
    precision: RolePrecisions
    placement: Placement | None = None
    mode: str = "sync"
    started: float = field(default_factory=time.monotonic)
    """When the run started (``time.monotonic``): ``train.max_time_minutes`` counts from here."""
    rewards: tuple = ()
    """Reward functions given as Python objects (:class:`~grpo_rl.envs.rewards.custom.RewardFunction`, the Python API's
    ``rewards``), added to the configured ones wherever an environment is built; actors get them pickled."""
    engine_urls: tuple[str, ...] = ()
    """The vLLM servers given to this process's engine: the user's (``inference_model.urls``) in the driver, its own
    one in a collector actor; empty otherwise. Servers the run starts are the
    :class:`~grpo_rl.engines.server.ServerFleet`'s, which holds their addresses."""
    train_env: Any = None
    """The training environment when :func:`~grpo_rl.run.setup.make_run` had to build it (``train.prompt_epochs``
    counts its prompts); None otherwise: :func:`~grpo_rl.run.setup.make_train_env` builds it. The driver's only."""

    @property
    def uses_ref(self) -> bool:
        """A KL penalty needs reference log-probs (from a reference model, or for LoRA the adapters-off model)."""
        return uses_reference(self.cfg)

    def actor_spec(self, role: str, index: int, engine_urls: tuple[str, ...] | None = None) -> ActorSpec:
        """The slice of this context that worker ``index`` of ``role`` (an actor) needs: the config sections of
        :data:`ACTOR_SECTIONS`; a collector drives one of ``engine_urls`` (the servers the run started; default
        :attr:`engine_urls`)."""
        from omegaconf import OmegaConf

        placement = getattr(self.placement, role)
        urls = self.engine_urls if engine_urls is None else tuple(engine_urls)
        if role == "collector" and urls:  # each collector drives a server of its own
            urls = (urls[index % len(urls)],)
        whole = OmegaConf.to_container(self.cfg, resolve=True)
        return ActorSpec(
            cfg={name: whole[name] for name in ACTOR_SECTIONS[role] if name in whole},
            run_dir=str(self.run_dir),
            model_path=self.model_path,
            role=role,
            index=index,
            device=actor_device(placement.devices[index]),
            threads=placement.threads,
            mode=self.mode,
            precision=self.precision,
            rewards=self.rewards,
            engine_urls=urls,
            trace=self.cfg.logger.trace,
        )


# The config sections each actor role reads, and all it is sent: reading another in the actor raises at once (rather
# than finding a schema default there). The driver's own settings (output_dir, resume, logger, ray) stay in it.
ACTOR_SECTIONS: dict[str, tuple[str, ...]] = {
    "collector": tuple(
        "seed model inference_model env reward reward_model sampling policy eval pipeline simulate train".split()
    ),
    "reference": tuple("seed model ref_model env sampling policy train pipeline simulate".split()),
    "learner": tuple(
        "seed model train_model ref_model inference_model env sampling policy optimizer train pipeline simulate".split()
    ),
}

# The role's own precision setting, resolved again on the actor's device (another node may be another CPU kind).
_OWN_PRECISION = {
    "collector": (("inference", "inference_model"),),
    "reference": (("ref", "ref_model"),),
    "learner": (("train", "train_model"), ("ref", "ref_model")),  # a LoRA learner is its own reference
}


def actor_device(device: torch.device) -> torch.device:
    """The device as an actor sees it: Ray exposes one GPU per actor, always as ``cuda:0``."""
    return torch.device("cuda", 0) if device.type == "cuda" else device


@dataclass(frozen=True)
class ActorSpec:
    """One actor's slice of the run context: plain values, so that Ray can ship it to another machine (the reward
    functions of the Python API are pickled by value, as Ray pickles any function)."""

    cfg: dict
    """The sections of :data:`ACTOR_SECTIONS` for ``role``, resolved to plain values."""
    run_dir: str
    model_path: str
    role: str
    index: int
    device: torch.device
    threads: int
    mode: str
    precision: RolePrecisions
    rewards: tuple = ()
    engine_urls: tuple[str, ...] = ()
    trace: bool = False
    """Record this actor's phases into the run's trace (``logger.trace``, :mod:`grpo_rl.trace`)."""

    def enter(self) -> RunContext:
        """Set this process's threads and return its :class:`RunContext`: every role on the actor's device, the
        config its sections alone, read-only (reading a section it was not sent raises)."""
        from omegaconf import OmegaConf

        from grpo_rl.model.loading import load_tokenizer

        torch.set_num_threads(self.threads)
        if self.trace:
            trace.start(Path(self.run_dir) / "trace", f"{self.role} {self.index}")
        cfg = OmegaConf.create(self.cfg, flags={"readonly": True})
        OmegaConf.set_struct(cfg, True)  # an unknown key raises instead of reading as None
        d = (self.device,)  # allocated by the driver; Ray exposes just this GPU here (a reward model shares it)
        reward_model = d if "reward" in cfg and cfg.reward.model_path else ()
        devices = DeviceAllocation(train=d, ref=d, inference=d, reward_model=reward_model)
        own = RolePlacement(self.role, d, self.threads, actors=False)
        placement = Placement(
            collector=replace(own, role="collector"),
            learner=replace(own, role="learner"),
            reference=replace(own, role="reference"),
            reward_model=None,
            driver_threads=self.threads,
            served=bool(self.engine_urls),
        )
        precision = self.precision
        for field_name, section in _OWN_PRECISION[self.role]:
            precision = replace(precision, **{field_name: resolve_precision(cfg[section].precision, self.device)})
        return RunContext(
            cfg=cfg,
            run_dir=Path(self.run_dir),
            devices=devices,
            model_path=self.model_path,
            tokenizer=load_tokenizer(self.model_path),
            precision=precision,
            placement=placement,
            mode=self.mode,
            rewards=self.rewards,
            engine_urls=self.engine_urls,
        )
