"""Start a vLLM server that a grpo_rl run can train with: ``python -m grpo_rl.cli.serve --model DIR [vLLM flags]``.

A run starts its own servers this way (:mod:`grpo_rl.engines.server`); start one yourself for a run to connect to
(``inference_model.urls``). On the same machine, loopback needs nothing more::

    export GRPO_RL_ENGINE_KEY=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
    python -m grpo_rl.cli.serve --model /models/my-policy --port 8000 --dtype bfloat16

For a run on another machine, serve with TLS (``--ssl-certfile cert.pem --ssl-keyfile key.pem`` on a non-loopback
``--host``; the run names ``https://HOST:8000`` and, for a self-signed certificate,
``inference_model.ssl_ca_certs=cert.pem``), or keep the server on loopback and reach it through an SSH tunnel
(``ssh -N -L 8000:127.0.0.1:8000 HOST``). A non-loopback ``--host`` without TLS is refused unless
``--allow-unencrypted-network`` says that the key and the weights may cross the network in cleartext.

The key comes from ``GRPO_RL_ENGINE_KEY`` (never the command line, which other users can read), at least 32
characters; give the run the same one. This adds to vLLM's own flags what training needs: the weight-update
routes (``VLLM_SERVER_DEV_MODE=1``) behind a key checked on every path (vLLM's ``--api-key`` leaves those routes
open), the token-in/token-out ``/inference/v1/generate`` route that reports which weight version sampled each token
(``--enable-scale-out``), log-probs of the distribution actually sampled from (``--logprobs-mode
processed_logprobs``), and the ``grpo_rl_file`` weight transport (a CPU one; pass ``--weight-transfer-config
'{"backend": "nccl"}'`` for NCCL between GPUs). On a CPU, a server without ``--kv-cache-memory-bytes`` takes the
KV cache a run's own servers take (``inference_model.kv_cache_gb``) instead of vLLM's share of the machine's
memory, which on a shared box grew until the kernel ended a process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from grpo_rl.config.checks import is_loopback_host
from grpo_rl.engines.vllm_plugin import BACKEND, KEY_ENV, MIN_KEY_LENGTH, PARENT_ENV

REQUIRED = (
    "--enable-scale-out",
    "--logprobs-mode",
    "processed_logprobs",
    "--middleware",
    "grpo_rl.engines.vllm_plugin.RequireKey",
)
CLEARTEXT_FLAG = "--allow-unencrypted-network"


def _value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def vllm_argv(args: list[str], *, on_cpu: bool = False) -> list[str]:
    """vLLM's API-server command line for ``args`` (the user may choose the weight transport, the address and the KV
    cache; the rest is always set)."""
    argv = [a for a in args if a != CLEARTEXT_FLAG] + list(REQUIRED)
    if _value(args, "--weight-transfer-config") is None:
        argv += ["--weight-transfer-config", f'{{"backend": "{BACKEND}"}}']
    if _value(args, "--host") is None and _value(args, "--uds") is None:
        argv += ["--host", "127.0.0.1"]
    if on_cpu and _value(args, "--kv-cache-memory-bytes") is None:
        from grpo_rl.config.schema import InferenceModelConfig

        argv += ["--kv-cache-memory-bytes", str(int(InferenceModelConfig.kv_cache_gb * 2**30))]
    return argv


def check_args(args: list[str], key: str) -> str | None:
    """What is wrong with serving ``args`` with ``key``, in one line (None: nothing)."""
    if not key:
        return (
            f"set {KEY_ENV} to a secret key: the server's weight-update routes must not be open. The run that "
            f"connects needs the same key."
        )
    if len(key) < MIN_KEY_LENGTH:
        return (
            f"{KEY_ENV} has {len(key)} characters; use at least {MIN_KEY_LENGTH}, e.g. "
            f'python -c "import secrets; print(secrets.token_urlsafe(32))"'
        )
    host = _value(args, "--host")
    tls = _value(args, "--ssl-certfile") and _value(args, "--ssl-keyfile")
    if host is not None and not is_loopback_host(host) and not tls and CLEARTEXT_FLAG not in args:
        return (
            f"--host {host} would send the key and the weights across the network in cleartext: serve with TLS "
            f"(--ssl-certfile and --ssl-keyfile), keep --host 127.0.0.1 and reach it through an SSH tunnel, or "
            f"pass {CLEARTEXT_FLAG} on a network you trust"
        )
    return None


def main(args: list[str] | None = None) -> None:
    args = sys.argv[1:] if args is None else args
    problem = check_args(args, os.environ.get(KEY_ENV, ""))
    if problem:
        sys.exit(f"error: {problem}")
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    if "--enable-lora" in args:  # a run's adapter pushes load through /v1/load_lora_adapter, behind the key
        os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    import torch

    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *vllm_argv(args, on_cpu=not torch.cuda.is_available()),
    ]
    if "--kv-cache-memory-bytes" in argv and _value(args, "--kv-cache-memory-bytes") is None:
        gib = int(_value(argv, "--kv-cache-memory-bytes")) / 2**30
        print(
            f"grpo_rl.cli.serve: KV cache {gib:g} GiB on the CPU (inference_model.kv_cache_gb's default; "
            f"--kv-cache-memory-bytes to change it)",
            file=sys.stderr,
            flush=True,
        )
    if os.environ.get(PARENT_ENV):
        sys.exit(serve_for_parent(argv, int(os.environ[PARENT_ENV])))
    os.execv(sys.executable, argv)


def serve_for_parent(argv: list[str], parent: int, grace_seconds: float = 10.0) -> int:
    """Run the server as a child and stop it, with every process of this session, when the run ``parent`` is
    gone or on SIGTERM/SIGINT; returns its exit status (0 when stopped)."""
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    server = subprocess.Popen(argv)
    # polling the parent notices a run killed by SIGKILL too, when nothing of its own cleanup runs
    while server.poll() is None and not stopping and os.getppid() == parent:
        time.sleep(0.5)
    if server.poll() is not None:
        return server.returncode
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the session-wide signals below are for the others
    # this process leads the session the run started it in: the session is exactly the server's processes
    os.killpg(0, signal.SIGTERM)  # vLLM stops its engine process on SIGTERM
    try:
        server.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        pass
    os.killpg(0, signal.SIGKILL)  # whatever is left, this process included
    return 0


if __name__ == "__main__":
    main()
