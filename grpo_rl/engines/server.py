"""vLLM servers that a run starts and stops: one child process per inference device.

Each server is vLLM's OpenAI-compatible API server (``python -m grpo_rl.cli.serve``, which adds what a training
run needs to vLLM's own command line and then becomes that server), started:

* **on its own device**: a GPU server sees only its GPU (``CUDA_VISIBLE_DEVICES``), so nothing it does can land
  on the learner's; a CPU server's OpenMP threads are bound to cores of its own
  (``VLLM_CPU_OMP_THREADS_BIND``) when several servers share the machine;
* **on loopback, with a key**: it binds to ``inference_model.server_host`` (``127.0.0.1`` unless the user asks
  otherwise) on a free port, and answers only requests that carry the run's key, a fresh random one per run
  (:class:`~grpo_rl.engines.vllm_plugin.RequireKey`);
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
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo_rl.engines.vllm_plugin import KEY_ENV, PARENT_ENV
from grpo_rl.errors import RoleFailed

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


def engine_args(*, dtype: str, max_model_len: int, seed: int, kv_cache_gb: float, gpu_memory_utilization: float,
                enforce_eager: bool, enable_prefix_caching: bool, on_cpu: bool) -> tuple[str, ...]:
    """vLLM engine flags equal to the in-process engine's (:class:`~grpo_rl.engines.vllm_engine.VLLMEngine`)."""
    args = ["--dtype", dtype, "--max-model-len", str(max_model_len), "--seed", str(seed),
            "--max-num-batched-tokens", str(max(8192, max_model_len)), "--no-enable-chunked-prefill"]
    args += ["--enforce-eager"] if enforce_eager else []
    args += ["--enable-prefix-caching" if enable_prefix_caching else "--no-enable-prefix-caching"]
    if on_cpu:
        args += ["--kv-cache-memory-bytes", str(int(kv_cache_gb * 2**30))]
    else:
        args += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    return tuple(args)


def server_env(spec: ServerSpec, key: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of ``spec``'s server process: only its own device visible, its own cores, the run's key."""
    env = dict(os.environ if base is None else base)
    env[KEY_ENV] = key
    env[PARENT_ENV] = str(os.getpid())  # the server stops when this process is gone (grpo_rl.cli.serve)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # mounts the weight-update routes; RequireKey guards them
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
    """One vLLM server started by this run."""

    def __init__(self, spec: ServerSpec, *, host: str, key: str, log_path: Path):
        self.spec, self.host, self.log_path = spec, host, log_path
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        cmd = [sys.executable, "-m", "grpo_rl.cli.serve", "--model", spec.model_path, "--host", host,
               "--port", str(self.port), *spec.vllm_args]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=server_env(spec, key), start_new_session=True,
                                        preexec_fn=_die_with_parent)

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
        host: the address they bind to.
        start_timeout: seconds until every server must answer ``/health``.
    """

    def __init__(self, specs: list[ServerSpec], run_dir: Path, *, host: str = "127.0.0.1",
                 start_timeout: float = 600.0):
        self.key = secrets.token_urlsafe(32)
        self.run_dir, self.host, self.start_timeout = Path(run_dir), host, start_timeout
        self.servers: list[ServerProcess] = []
        try:
            for i, spec in enumerate(specs):
                self.servers.append(ServerProcess(spec, host=host, key=self.key,
                                                  log_path=Path(run_dir) / f"engine_server_{i}.log"))
            self._wait_healthy(start_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def _wait_healthy(self, timeout: float, servers: list[ServerProcess] | None = None) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        waiting = list(self.servers if servers is None else servers)
        headers = {"Authorization": f"Bearer {self.key}"}
        while waiting:
            for server in list(waiting):
                code = server.exited()
                if code is not None:
                    raise RoleFailed(f"engine server {server.url} exited with code {code} while starting; "
                                     f"its log: {server.log_path}")
                try:
                    if httpx.get(server.url + "/health", headers=headers, timeout=5).status_code == 200:
                        waiting.remove(server)
                        log.info("engine server %s is up (pid %d, %s, log %s)", server.url, server.process.pid,
                                 server.spec.device, server.log_path)
                except httpx.HTTPError:
                    pass
            if waiting and time.monotonic() > deadline:
                raise RoleFailed(f"engine server {waiting[0].url} did not become healthy within "
                                 f"inference_model.server_start_timeout_s={timeout:g}; its log: {waiting[0].log_path}")
            if waiting:
                time.sleep(1.0)

    def healthy(self, index: int, timeout: float = 10.0) -> bool:
        """Server ``index`` is running and answers ``/health`` within ``timeout`` seconds."""
        import httpx

        server = self.servers[index]
        if server.exited() is not None:
            return False
        try:
            return httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {self.key}"},
                             timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def replace(self, index: int) -> str:
        """Stop server ``index`` (what is left of it) and start another on the same device and a fresh port; its
        address, once it answers ``/health`` (within ``inference_model.server_start_timeout_s``)."""
        old = self.servers[index]
        old.stop(grace_seconds=5.0)
        restarts = len(list(self.run_dir.glob(f"engine_server_{index}.*.log")))
        new = ServerProcess(old.spec, host=self.host, key=self.key,
                            log_path=self.run_dir / f"engine_server_{index}.{restarts + 1}.log")
        self.servers[index] = new
        self._wait_healthy(self.start_timeout, [new])
        return new.url

    def check_alive(self) -> None:
        """Raise :class:`RoleFailed` naming the first server that exited."""
        for server in self.servers:
            code = server.exited()
            if code is not None:
                raise RoleFailed(f"engine server {server.url} exited with code {code}; its log: {server.log_path}")

    def describe(self) -> str:
        return "\n".join(f"  engine server {s.url}  pid {s.process.pid}  {s.spec.device}  log {s.log_path}"
                         for s in self.servers)

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers = []
