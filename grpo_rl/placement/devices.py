"""Role -> device allocation, decided once, validated, logged and handed down as ``torch.device`` values.

Three roles share a machine: the learner (``train_model``), the reference scorer (``ref_model``) and the
rollout engine (``inference_model``). Each asks for ``num_devices`` or an explicit ``devices`` list.

* On a machine with GPUs, roles get disjoint GPUs, in the order train, ref, inference, unless explicit
  lists say otherwise; overlap is an error unless ``ref_model.share_with_train`` asks for it.
* The defaults (one device per role, no lists) on fewer GPUs than roles share instead of failing: on two GPUs
  the reference shares the learner's GPU; on one every role runs on it (the roles take turns in ``sota/grpo.py``;
  ``inference_model.gpu_memory_utilization`` bounds the engine's share).
* A fourth role, ``reward_model``, exists only when ``reward.model_path`` is set; on GPUs it comes after the
  others (its own GPU), on the CPU it maps to the CPU.
* On a machine without GPUs every role maps to the CPU. ``num_devices`` then counts CPU workers (processes);
  one role's workers compute at once and need a core each, and all roles together get at most 2 per core.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

import torch

from grpo_rl.errors import ConfigError

log = logging.getLogger(__name__)

ROLES = ("train_model", "ref_model", "inference_model", "reward_model")


@dataclass(frozen=True)
class DeviceAllocation:
    """Concrete devices per role; a role with ``k`` workers holds ``k`` entries (CPU workers repeat ``cpu``)."""

    train: tuple[torch.device, ...]
    ref: tuple[torch.device, ...]
    inference: tuple[torch.device, ...]
    reward_model: tuple[torch.device, ...] = ()
    """Empty unless a reward model is configured."""

    @property
    def on_gpu(self) -> bool:
        return self.train[0].type == "cuda"

    @property
    def engine_shares_a_gpu(self) -> bool:
        """An engine runs on a GPU that the learner uses too (one GPU for every role)."""
        return self.on_gpu and bool(set(self.train) & set(self.inference))

    def describe(self) -> str:
        def fmt(devs: tuple[torch.device, ...]) -> str:
            return ", ".join(str(d) for d in devs)

        text = f"train: [{fmt(self.train)}]  ref: [{fmt(self.ref)}]  inference: [{fmt(self.inference)}]"
        return text + (f"  reward_model: [{fmt(self.reward_model)}]" if self.reward_model else "")


def available_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def available_cpus(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """The cores this process may run on: its CPU affinity capped by a cgroup CPU quota, rounded up; at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))  # a container's or taskset's cpuset; os.cpu_count() counts the host's
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(cgroup_root)  # docker --cpus=2: cgroup v2 cpu.max, or v1 cpu.cfs_quota_us / period
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_cpu_quota(root: str) -> float | None:
    """CPUs' worth of time per period the cgroup grants, or None (no limit, or no cgroup files)."""
    try:
        with open(os.path.join(root, "cpu.max")) as f:  # v2: "<quota> <period>" or "max <period>"
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as f:
            quota_us = int(f.read())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as f:
            period_us = int(f.read())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def allocate_devices(
    cfg,
    *,
    need_ref: bool = True,
    need_reward_model: bool | None = None,
    num_gpus: int | None = None,
    num_cpus: int | None = None,
) -> DeviceAllocation:
    """Turn the ``train_model``, ``ref_model`` and ``inference_model`` groups into devices.

    Args:
        need_ref: whether a reference model is used (KL on); if not, the ref role takes no device.
        need_reward_model: whether a reward model is used (default: ``cfg.reward.model_path`` is set).
        num_gpus: GPUs on this machine (default: detected).
        num_cpus: CPU cores this process may use (default: :func:`available_cpus`).

    Raises:
        ConfigError: the request cannot be met; the message names the key and the fix.
    """
    num_gpus = available_gpus() if num_gpus is None else num_gpus
    num_cpus = available_cpus() if num_cpus is None else num_cpus
    if need_reward_model is None:
        need_reward_model = bool(cfg.reward.model_path)
    roles = [r for r in ROLES if (need_ref or r != "ref_model") and (need_reward_model or r != "reward_model")]
    if num_gpus == 0:
        alloc = _allocate_cpu(cfg, roles, num_cpus)
    else:
        alloc = _allocate_gpu(cfg, roles, num_gpus)
    log.debug("device allocation: %s", alloc.describe())
    return alloc


def _allocate_cpu(cfg, roles: list[str], num_cpus: int) -> DeviceAllocation:
    counts = {}
    for role in roles:
        role_cfg = getattr(cfg, role)
        if role_cfg.devices:
            raise ConfigError(
                f"{role}.devices={list(role_cfg.devices)} names GPUs, but this machine has none "
                f"(torch.cuda.device_count() == 0). Remove {role}.devices to run every role on the CPU."
            )
        counts[role] = int(role_cfg.num_devices)
    total = sum(counts.values())
    # A role's workers (e.g. data-parallel learner ranks) compute at once: each needs a core. Roles take turns
    # in the synchronous loop and split the cores in the asynchronous one, so their sum may exceed the cores,
    # but not by more than 2 workers per core.
    if max(counts.values()) > 1 and (max(counts.values()) > num_cpus or total > 2 * num_cpus):
        asked = ", ".join(f"{r}.num_devices={n}" for r, n in counts.items())
        raise ConfigError(
            f"{asked}: on a machine without GPUs num_devices counts CPU worker processes, and {total} workers "
            f"do not fit on {num_cpus} CPU cores (one role's workers need a core each). Lower num_devices, "
            f"or run on a machine with GPUs."
        )
    if max(counts.values()) > 1 and total > num_cpus:
        log.warning("%d CPU workers on %d cores: roles that compute at the same time share cores", total, num_cpus)
    cpu = torch.device("cpu")
    return DeviceAllocation(
        train=(cpu,) * counts["train_model"],
        ref=(cpu,) * counts.get("ref_model", 1),
        inference=(cpu,) * counts["inference_model"],
        reward_model=(cpu,) * counts.get("reward_model", 0),
    )


def _colocated(roles: list[str], num_gpus: int) -> dict[str, list[int]]:
    """GPU indices for the default request (one device per role) on fewer GPUs than roles: a GPU each in the order
    train, inference, ref, reward model while they last; then the reference shares the learner's GPU and the
    engine and a reward model share the learner's or the engine's."""
    partner = {"inference_model": "train_model", "ref_model": "train_model", "reward_model": "inference_model"}
    assigned: dict[str, list[int]] = {}
    for role in ("train_model", "inference_model", "ref_model", "reward_model"):
        if role in roles:
            assigned[role] = [len(assigned)] if len(assigned) < num_gpus else assigned[partner[role]]
    return assigned


def _allocate_gpu(cfg, roles: list[str], num_gpus: int) -> DeviceAllocation:
    share = bool(cfg.ref_model.share_with_train)
    explicit = {r: list(getattr(cfg, r).devices) for r in roles if getattr(cfg, r).devices}
    if not explicit and num_gpus < len(roles) and all(getattr(cfg, r).num_devices == 1 for r in roles):
        assigned = _colocated(roles, num_gpus)
        log.info(
            "%d GPU%s for %d roles: %s",
            num_gpus,
            "" if num_gpus == 1 else "s",
            len(roles),
            ", ".join(f"{r} on cuda:{ids[0]}" for r, ids in assigned.items()),
        )
        return _cuda_allocation(assigned)
    used: set[int] = {i for ids in explicit.values() for i in ids}
    for role, ids in explicit.items():
        bad = [i for i in ids if not 0 <= i < num_gpus]
        if bad:
            raise ConfigError(
                f"{role}.devices={ids}: GPU(s) {bad} do not exist; this machine has GPUs 0..{num_gpus - 1}"
            )
        if len(set(ids)) != len(ids):
            raise ConfigError(f"{role}.devices={ids} lists a GPU twice")
    next_free = 0
    assigned: dict[str, list[int]] = {}
    for role in roles:
        if role in explicit:
            assigned[role] = explicit[role]
            continue
        if role == "ref_model" and share:
            assigned[role] = list(assigned["train_model"][: cfg.ref_model.num_devices])
            continue
        ids = []
        while len(ids) < getattr(cfg, role).num_devices:
            while next_free in used:
                next_free += 1
            if next_free >= num_gpus:
                asked = ", ".join(f"{r}.num_devices={getattr(cfg, r).num_devices}" for r in roles)
                raise ConfigError(
                    f"{asked}: needs more GPUs than the {num_gpus} this machine has. Lower num_devices, or set "
                    f"ref_model.share_with_train=true to put the reference on the training GPUs (with one device "
                    f"per role and no devices lists, the roles share the GPUs there are)."
                )
            ids.append(next_free)
            used.add(next_free)
        assigned[role] = ids
    for a in roles:
        for b in roles:
            if a < b and set(assigned[a]) & set(assigned[b]):
                if {a, b} == {"train_model", "ref_model"} and share:
                    continue
                raise ConfigError(
                    f"{a} {assigned[a]} and {b} {assigned[b]} share GPUs "
                    f"{sorted(set(assigned[a]) & set(assigned[b]))}; "
                    f"give them disjoint devices (ref_model.share_with_train=true allows train/ref overlap)"
                )
    return _cuda_allocation(assigned)


def _cuda_allocation(assigned: dict[str, list[int]]) -> DeviceAllocation:
    cuda = lambda ids: tuple(torch.device("cuda", i) for i in ids)  # noqa: E731
    return DeviceAllocation(
        train=cuda(assigned["train_model"]),
        ref=cuda(assigned.get("ref_model", assigned["train_model"][:1])),
        inference=cuda(assigned["inference_model"]),
        reward_model=cuda(assigned.get("reward_model", [])),
    )
