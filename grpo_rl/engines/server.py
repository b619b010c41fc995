"""vLLM servers that a run starts and stops: one child process per inference device.

Each server is vLLM's OpenAI-compatible API server (``python -m grpo_rl.cli.serve``, which adds what a training
run needs to vLLM's own command line and then becomes that server), started:

* **on its own device**: a GPU server sees only its GPU (``CUDA_VISIBLE_DEVICES``), so nothing it does can land
  on the learner's; a CPU server's OpenMP threads are bound to cores of its own
  (``VLLM_CPU_OMP_THREADS_BIND``) when several servers share the machine;
* **on a private socket, with a key**: by default on a Unix socket (vLLM's ``--uds``) in a folder of mode 0700 that
  the run makes, so no other local user can connect to it, bind it first or listen in, and nothing listens on a
  TCP port. Only where ``inference_model.server_host`` names another address (for collectors on other machines)
  does it listen on TCP there, with TLS (``inference_model.ssl_certfile``/``ssl_keyfile``) unless the user allowed
  cleartext (``inference_model.allow_unencrypted_network``). Either way it answers only requests that carry the
  run's key, a fresh random one per run (:class:`~grpo_rl.engines.vllm_plugin.RequireKey`), and the run sends the
  key only after the server proved it holds it (:meth:`~grpo_rl.engines.server_client.ServerClient.verify`): a
  process that took a TCP port first learns nothing;
* **tied to the run**: it runs in a session of its own (a Ctrl-C in the terminal reaches the driver, which stops
  it), led by a small watcher (:func:`grpo_rl.cli.serve.serve_for_parent`) that stops every process of the session
  once the driver is gone, even killed by SIGKILL, when none of the driver's own cleanup runs; the kernel also
  sends the watcher SIGTERM then (``PR_SET_PDEATHSIG``). :meth:`ServerProcess.stop` sends SIGTERM to the whole
  session and SIGKILL after a grace period;
* **logged in the run folder**: ``engine_server_<i>.log``; a server that exits or does not become healthy within
  ``inference_model.server_start_timeout_s`` ends the start-up with one line naming that log.

vLLM takes tens of seconds to start (about 30 to 60 s for a tiny model on a CPU), so the servers are launched
together and awaited together.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo_rl.config.checks import is_loopback_host
from grpo_rl.engines.server_client import ServerClient
from grpo_rl.engines.vllm_engine import AdapterSlots
from grpo_rl.engines.vllm_plugin import KEY_ENV, PARENT_ENV
from grpo_rl.errors import RoleFailed
from grpo_rl.placement.ray import loopback_env

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ServerSpec:
    """What one server serves and where.

    Attributes:
        model_path: local HF folder.
        device: ``cpu`` or ``cuda:i`` (an index on the driver's machine).
        threads: OpenMP threads of a CPU server.
        cores: the CPU cores its threads are bound to (empty: vLLM's own choice).
        vllm_args: engine arguments (see :func:`engine_args`).
    """

    model_path: str
    device: torch.device
    threads: int = 1
    cores: tuple[int, ...] = ()
    vllm_args: tuple[str, ...] = field(default_factory=tuple)


def engine_args(
    *,
    dtype: str,
    max_model_len: int,
    seed: int,
    kv_cache_gb: float,
    gpu_memory_utilization: float,
    enforce_eager: bool,
    enable_prefix_caching: bool,
    on_cpu: bool,
    adapters: AdapterSlots | None = None,
) -> tuple[str, ...]:
    """vLLM engine flags equal to the in-process engine's (:class:`~grpo_rl.engines.vllm_engine.VLLMEngine`);
    ``adapters``: the server loads the LoRA adapters that pushes carry (``model.lora.push=adapter``)."""
    args = [
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--seed",
        str(seed),
        "--max-num-batched-tokens",
        str(max(8192, max_model_len)),
        "--no-enable-chunked-prefill",
    ]
    args += ["--enforce-eager"] if enforce_eager else []
    args += ["--enable-prefix-caching" if enable_prefix_caching else "--no-enable-prefix-caching"]
    if on_cpu:
        args += ["--kv-cache-memory-bytes", str(int(kv_cache_gb * 2**30))]
    else:
        args += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if adapters is not None:
        args += ["--enable-lora", "--max-loras", str(adapters.slots), "--max-lora-rank", str(adapters.max_rank)]
    return tuple(args)


def server_env(spec: ServerSpec, key: str, base: dict[str, str] | None = None, *, local: bool = True) -> dict[str, str]:
    """The environment of ``spec``'s server process: only its own device visible, its own cores, the run's key,
    and, for a ``local`` server, its own groups on loopback."""
    env = dict(os.environ if base is None else base)
    if local:
        env.update({k: v for k, v in loopback_env().items() if k not in env})
    env[KEY_ENV] = key
    env[PARENT_ENV] = str(os.getpid())  # the server stops when this process is gone (grpo_rl.cli.serve)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # mounts the weight-update routes; RequireKey guards them
    env["PYTHONUNBUFFERED"] = "1"  # its log is whole up to the moment it stops, even when it is killed
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # set for in-process engines; a server wants its own engine process
    if spec.device.type == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(spec.device.index or 0)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["OMP_NUM_THREADS"] = str(spec.threads)
        if spec.cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in spec.cores)
    return env


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the driver's own cleanup still stops the server
        pass


class ServerProcess:
    """One vLLM server started by this run, on the Unix socket ``socket_path``, or on ``host`` and a free port.

    ``tls``: vLLM's ``--ssl-certfile``/``--ssl-keyfile`` pair for a TCP server (its URL is then ``https``)."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        key: str,
        log_path: Path,
        socket_path: Path | None = None,
        host: str = "127.0.0.1",
        tls: tuple[str, str] | None = None,
    ):
        self.spec, self.log_path = spec, log_path
        if socket_path is not None:
            self.url = f"unix:{socket_path}"
            where = ["--uds", str(socket_path)]
        else:  # a port another process may take first: the key still goes only to a server that proves it
            port = free_port(host)
            self.url = f"{'https' if tls else 'http'}://{host}:{port}"
            where = ["--host", host, "--port", str(port)]
            where += ["--ssl-certfile", tls[0], "--ssl-keyfile", tls[1]] if tls else []
        cmd = [sys.executable, "-m", "grpo_rl.cli.serve", "--model", spec.model_path, *where, *spec.vllm_args]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=server_env(spec, key, local=socket_path is not None),
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def exited(self) -> int | None:
        return self.process.poll()

    def stop(self, grace_seconds: float = 15.0) -> None:
        """SIGTERM to the server's session (server and engine process), SIGKILL after ``grace_seconds``."""
        if self.process.poll() is None:
            _signal_session(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_seconds)
            except subprocess.TimeoutExpired:
                _signal_session(self.process.pid, signal.SIGKILL)
                self.process.wait()
        _signal_session(self.process.pid, signal.SIGKILL)  # anything of its session still left
        self._log.close()


def _signal_session(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ServerFleet:
    """The servers of a run: started together, awaited together, stopped together.

    Args:
        specs: one per server.
        run_dir: where the servers' logs go.
        host: the address they listen on: loopback (the default) puts each on a Unix socket in a private folder.
        start_timeout: seconds until every server must answer ``/health``.
        tls: ``(certfile, keyfile)`` for servers on another address; ``ca_certs`` verifies them.
    """

    def __init__(
        self,
        specs: list[ServerSpec],
        run_dir: Path,
        *,
        host: str = "127.0.0.1",
        start_timeout: float = 600.0,
        tls: tuple[str, str] | None = None,
        ca_certs: str | None = None,
    ):
        self.key = secrets.token_urlsafe(32)
        self.run_dir, self.host, self.start_timeout = Path(run_dir), host, start_timeout
        self.tls, self.ca_certs = tls, ca_certs
        self.socket_dir = private_socket_dir() if is_loopback_host(host) else None
        self.servers: list[ServerProcess] = []
        self._clients: list[ServerClient] = []
        try:
            for i, spec in enumerate(specs):
                self.servers.append(self._start(i, spec, Path(run_dir) / f"engine_server_{i}.log"))
            self._wait_healthy(start_timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, index: int, spec: ServerSpec, log_path: Path) -> ServerProcess:
        socket_path = None
        if self.socket_dir is not None:
            socket_path = self.socket_dir / f"{index}.{secrets.token_hex(4)}.sock"
        server = ServerProcess(
            spec, key=self.key, log_path=log_path, socket_path=socket_path, host=self.host, tls=self.tls
        )
        client = ServerClient(server.url, self.key, timeout=10.0, ca_certs=self.ca_certs)
        if index < len(self._clients):
            self._clients[index].close()
            self._clients[index] = client
        else:
            self._clients.append(client)
        return server

    @property
    def urls(self) -> tuple[str, ...]:
        """The servers' addresses now (a replaced server's new one)."""
        return tuple(s.url for s in self.servers)

    def _wait_healthy(self, timeout: float, indices: list[int] | None = None) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(range(len(self.servers)) if indices is None else indices)
        while waiting:
            for index in list(waiting):
                server = self.servers[index]
                code = server.exited()
                if code is not None:
                    raise RoleFailed(
                        f"engine server {server.url} exited with code {code} while starting; its log: {server.log_path}"
                    )
                if self._answers(index):
                    waiting.remove(index)
                    log.info(
                        "engine server %s is up (pid %d, %s, log %s)",
                        server.url,
                        server.process.pid,
                        server.spec.device,
                        server.log_path,
                    )
            if waiting and time.monotonic() > deadline:
                server = self.servers[waiting[0]]
                raise RoleFailed(
                    f"engine server {server.url} did not become healthy within "
                    f"inference_model.server_start_timeout_s={timeout:g}; its log: {server.log_path}"
                )
            if waiting:
                time.sleep(1.0)

    def _answers(self, index: int) -> bool:
        """Server ``index`` proved it holds the key (nothing sent before that) and answers ``/health``."""
        client = self._clients[index]
        if not client.proves_key():
            return False
        try:
            client.get("/health")
            return True
        except RoleFailed:
            return False

    def healthy(self, index: int) -> bool:
        """Server ``index`` is running and answers ``/health`` (within 10 s)."""
        return self.servers[index].exited() is None and self._answers(index)

    def replace(self, index: int) -> str:
        """Stop server ``index`` (what is left of it) and start another on the same device; its address, once it
        answers ``/health`` (within ``inference_model.server_start_timeout_s``)."""
        old = self.servers[index]
        old.stop(grace_seconds=5.0)
        restarts = len(list(self.run_dir.glob(f"engine_server_{index}.*.log")))
        self.servers[index] = self._start(index, old.spec, self.run_dir / f"engine_server_{index}.{restarts + 1}.log")
        self._wait_healthy(self.start_timeout, [index])
        return self.servers[index].url

    def lost(self) -> list[int]:
        """The servers that no longer answer (:meth:`healthy`)."""
        return [i for i in range(len(self.servers)) if not self.healthy(i)]

    def replace_lost(self, index: int) -> str:
        """The one way a run replaces a lost server (both loops): start server ``index`` again on its device (what
        is left of it stopped first) and return its new address, which :attr:`urls` holds from then on."""
        log.warning("engine server %s does not answer: starting another", self.servers[index].url)
        return self.replace(index)

    def check_alive(self) -> None:
        """Raise :class:`RoleFailed` naming the first server that exited."""
        for server in self.servers:
            code = server.exited()
            if code is not None:
                raise RoleFailed(f"engine server {server.url} exited with code {code}; its log: {server.log_path}")

    def describe(self) -> str:
        return "\n".join(
            f"  engine server {s.url}  pid {s.process.pid}  {s.spec.device}  log {s.log_path}" for s in self.servers
        )

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        for client in self._clients:
            client.close()
        self.servers, self._clients = [], []
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


SOCKET_DIR_PREFIX = "grpo_rl_servers_"


def private_socket_dir() -> Path:
    """A fresh folder of mode 0700 for the run's server sockets (short: a socket path has at most 107 bytes).
    Folders that runs now gone left behind (a SIGKILLed driver runs no cleanup) are removed first."""
    base = Path(tempfile.gettempdir())
    for stale in base.glob(f"{SOCKET_DIR_PREFIX}*_*"):
        pid = stale.name[len(SOCKET_DIR_PREFIX) :].split("_", 1)[0]
        try:
            st = stale.lstat()
            if not pid.isdigit() or st.st_uid != os.getuid() or not stale.is_dir() or stale.is_symlink():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except OSError:  # alive and someone else's, or gone from under us
            continue
    return Path(tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{os.getpid()}_", dir=base))
