"""Ray start-up, once per run, sized from the run's placement (:mod:`grpo_rl.placement.context`), and the
addresses the run's own rendezvous (the learner group's process group, the weight broadcast) listen on.

``ray.address=null`` starts a local instance (stopped again by :func:`stop_ray`); ``ray.address=auto`` or
``ray://host:port`` joins a running cluster, which is left running. What each actor asks for (GPUs, CPUs,
``OMP_NUM_THREADS``) is its role's :meth:`~grpo_rl.placement.context.RolePlacement.ray_options`.

Nothing listens beyond loopback on one machine. A local instance gets the node address 127.0.0.1, and Ray then
binds its GCS, raylet, object manager, workers and agents to loopback only; the rendezvous bind the node address
Ray reports (:func:`node_address`), which is then loopback too. A joined cluster's node address is the interface
Ray uses between machines, and everything listens there: that network must be trusted. Ray's own servers check
a token where the cluster has one (``ray get-auth-token --generate``); torch's ``TCPStore``, gloo and NCCL check
nothing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
from datetime import timedelta

import torch

from grpo_rl.config.checks import is_loopback_host
from grpo_rl.placement.devices import available_cpus

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def start_ray(
    ray_cfg, *, min_cpus: int = 0, actor_gpus: list[torch.device] = (), withhold: tuple[str, ...] = ()
) -> bool:
    """Start or join Ray as ``ray_cfg`` says; return True if this call started a local instance.

    Args:
        min_cpus: logical CPUs the run's actors ask for in total; a local instance gets at least that many
            (oversubscription is then visible in the thread counts, not as an actor that never starts).
        actor_gpus: the GPUs allocated to roles that run as actors, the only ones a local instance is given. A
            joined cluster places actors on GPUs itself: start its node on the driver's machine without the
            learner's GPUs (``ray start --num-gpus``).
        withhold: environment variables a local instance's processes must not inherit (a secret only some
            actors are given, in their own ``runtime_env``).
    """
    import ray

    if ray.is_initialized():
        return False
    common = dict(include_dashboard=ray_cfg.include_dashboard, log_to_driver=True, configure_logging=False)
    if ray_cfg.address:
        ray.init(address=ray_cfg.address, **common)
        log.info("joined Ray cluster at %s: %s", ray_cfg.address, ray.cluster_resources())
        return False
    if os.environ.get("RAY_ADDRESS"):
        log.info("RAY_ADDRESS is set but not used: a run joins a Ray cluster by ray.address only")
    num_cpus = max(ray_cfg.num_cpus or available_cpus(), min_cpus)
    # only these, so Ray never places an actor on a GPU of a role that runs in the driver, such as the learner
    gpu_ids = sorted({d.index for d in actor_gpus if d.type == "cuda"})
    # The Ray processes started now inherit this process's environment: only the actors' GPUs, none of the secrets.
    inherited = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_ids)
        if gpu_ids
        else os.environ.get("CUDA_VISIBLE_DEVICES"),
        **{name: None for name in withhold},
    }
    # No idle workers started ahead (Ray starts num_cpus of them, each a Python start of about 0.8 s of CPU, while
    # the actors import): the role actors carry their own runtime_env and could take none over; the buffer, which
    # could, starts one on demand.
    no_prestart = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}
    with _environment(inherited):
        _init_on_loopback(num_cpus=num_cpus, num_gpus=len(gpu_ids), _system_config=no_prestart, **common)
    log.info("started a local Ray instance: %d CPUs, GPUs %s for actors", num_cpus, gpu_ids or "none")
    return True


@contextlib.contextmanager
def _environment(values: dict[str, str | None]):
    """``values`` in ``os.environ`` while the block runs (None: unset), then as before."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for key, value in values.items():
            _set_env(key, value)
        yield
    finally:
        for key, value in saved.items():
            _set_env(key, value)


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


_RAY_LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _init_on_loopback(**init_kwargs) -> None:
    """``ray.init`` of a local instance whose every server listens on loopback only.

    Raises:
        RuntimeError: Ray took another address anyway (a Ray version that decides it differently).
    """
    import ray
    from ray._private import ray_constants

    # Ray binds loopback only at node address 127.0.0.1, which on Linux ray.init replaces by the routable address
    # unless multi-node support is off (as on macOS and Windows). Ray read the variable into ray_constants when
    # torchrl imported it: hence the constant too. Ray's processes inherit the variable; this one gets both back.
    before_env, before_flag = os.environ.get(_RAY_LOCAL_ONLY), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_RAY_LOCAL_ONLY], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        # "local": an instance of its own, never one that RAY_ADDRESS or another process's `ray start` points at
        _init_with_retries(lambda: ray.init(address="local", _node_ip_address=LOOPBACK, **init_kwargs))
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_flag
        if before_env is None:
            os.environ.pop(_RAY_LOCAL_ONLY, None)
        else:
            os.environ[_RAY_LOCAL_ONLY] = before_env
    found = node_address()
    if not is_loopback_host(found):
        ray.shutdown()
        raise RuntimeError(
            f"the local Ray instance took the node address {found}, not loopback: its servers would "
            f"listen beyond this machine (ray {ray.__version__}; see grpo_rl/placement/ray.py)"
        )


START_ATTEMPTS = 3


def _init_with_retries(init, attempts: int = START_ATTEMPTS) -> None:
    """``init()``, started again where Ray's node did not come up in time.

    Ray gives its raylet a fixed 30 s to register with its GCS; on a machine whose cores are all busy (another
    run's import, a compile) it can take longer, and ``ray.init`` then raises with the processes it started still
    running. Those are stopped before the next attempt, which picks new ports and a new session folder.
    """
    import psutil

    me = psutil.Process()
    for attempt in range(1, attempts + 1):
        before = {p.pid for p in me.children(recursive=True)}
        try:
            init()
            return
        except Exception as e:
            if "timed out during startup" not in str(e) or attempt == attempts:
                raise
            _stop_processes([p for p in me.children(recursive=True) if p.pid not in before])
            log.warning(
                "Ray's node did not start in time on a busy machine (%s); starting it again, %d of %d",
                e,
                attempt + 1,
                attempts,
            )


def _stop_processes(processes) -> None:
    """SIGTERM, then SIGKILL whatever is left after 5 s."""
    import psutil

    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(processes, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def stop_ray(started: bool) -> None:
    """Shut Ray down if :func:`start_ray` started it (a joined cluster keeps running)."""
    import ray

    if started and ray.is_initialized():
        ray.shutdown()


def node_address() -> str:
    """The address Ray gave this node (Ray must be running): 127.0.0.1 for a local instance, else the interface
    Ray uses between machines; the run's rendezvous listen there and nowhere else."""
    import ray

    return ray.util.get_node_ip_address()


def loopback_env() -> dict[str, str]:
    """What keeps a process's own one-machine groups on loopback whatever the host name resolves to: vLLM's
    address for its one-rank group (``VLLM_HOST_IP``), and the interface gloo's and NCCL's default groups take."""
    lo = interface_with_address(LOOPBACK)
    return {"VLLM_HOST_IP": LOOPBACK, "GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo}


@contextlib.contextmanager
def on_loopback():
    """:func:`loopback_env` in this process while the block runs (where the user set none), then as before:
    gloo and NCCL read these when a group is made, and later groups choose their own interface."""
    with _environment({k: os.environ.get(k, v) for k, v in loopback_env().items()}):
        yield


def host_store(address: str, timeout: float, *, port: int = 0):
    """A ``torch.distributed.TCPStore`` server listening on ``address`` only; ``port`` 0 takes a free one (read
    the store's ``port``)."""
    import torch.distributed as dist

    # Handed a bound socket (which it then owns), the store does not bind every interface; binding port 0 here
    # also leaves no moment between choosing a free port and listening on it for another process to take it.
    listener = socket.socket(_family(address), socket.SOCK_STREAM)
    try:
        listener.bind((address, port))
        listener.listen()
    except OSError:
        listener.close()
        raise
    port, fd = listener.getsockname()[1], listener.detach()
    try:
        return dist.TCPStore(
            address, port, None, True, timedelta(seconds=timeout), wait_for_workers=False, master_listen_fd=fd
        )
    except BaseException:
        with contextlib.suppress(OSError):  # unless the store closed it already
            os.close(fd)
        raise


def address_towards(host: str) -> str:
    """This machine's address on the route to ``host``: what a member of a group hosted at ``host`` binds
    (loopback for a loopback host). Sends nothing."""
    with socket.socket(_family(host), socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


def interface_with_address(address: str) -> str:
    """The name of the network interface holding ``address`` (Linux), for ``GLOO_SOCKET_IFNAME`` and
    ``NCCL_SOCKET_IFNAME``: gloo's default group and NCCL choose their interface by name only."""
    import fcntl
    import struct

    ip = ipaddress.ip_address(address)
    if ip.version == 6:
        with open("/proc/net/if_inet6") as table:  # address (hex), index, prefix, scope, flags, name
            for row in table:
                fields = row.split()
                if ipaddress.ip_address(bytes.fromhex(fields[0])) == ip:
                    return fields[-1]
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:  # SIOCGIFADDR: the interface's IPv4 address, at bytes 20..24 of the struct ifreq it fills
                    ifreq = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                except OSError:  # no IPv4 address
                    continue
                if socket.inet_ntoa(ifreq[20:24]) == address:
                    return name
    raise RuntimeError(
        f"no network interface of this machine holds {address}, the address its process groups must bind"
    )


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
