"""Start a vLLM server that a grpo_rl run can train with: ``python -m grpo_rl.cli.serve --model DIR [vLLM flags]``.

A run starts its own servers this way (:mod:`grpo_rl.engines.server`); start one yourself for a run on another
machine to connect to (``inference_model.urls=[http://HOST:PORT]``)::

    export GRPO_RL_ENGINE_KEY=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
    python -m grpo_rl.cli.serve --model /models/my-policy --host 0.0.0.0 --port 8000 --dtype bfloat16

and give the run the same ``GRPO_RL_ENGINE_KEY``. This adds to vLLM's own flags what training needs: the
weight-update routes (``VLLM_SERVER_DEV_MODE=1``) behind a key checked on every path (vLLM's ``--api-key`` leaves
those routes open), the token-in/token-out ``/inference/v1/generate`` route that reports which weight version
sampled each token (``--enable-scale-out``), log-probs of the distribution actually sampled from
(``--logprobs-mode processed_logprobs``), and the ``grpo_rl_file`` weight transport (a CPU one; pass
``--weight-transfer-config '{"backend": "nccl"}'`` for NCCL between GPUs). Without a key it refuses to start.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from grpo_rl.engines.vllm_plugin import BACKEND, KEY_ENV, PARENT_ENV

REQUIRED = ("--enable-scale-out", "--logprobs-mode", "processed_logprobs",
            "--middleware", "grpo_rl.engines.vllm_plugin.RequireKey")


def vllm_argv(args: list[str]) -> list[str]:
    """vLLM's API-server command line for ``args`` (the user may choose the weight transport and host; the rest is always set)."""
    argv = list(args) + list(REQUIRED)
    if not any(a.startswith("--weight-transfer-config") for a in args):
        argv += ["--weight-transfer-config", '{"backend": "%s"}' % BACKEND]
    if not any(a == "--host" or a.startswith("--host=") for a in args):
        argv += ["--host", "127.0.0.1"]
    return argv


def main(args: list[str] | None = None) -> None:
    args = sys.argv[1:] if args is None else args
    if not os.environ.get(KEY_ENV):
        sys.exit(f"error: set {KEY_ENV} to a secret key: the server's weight-update routes must not be open. "
                 f"The run that connects needs the same key.")
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *vllm_argv(args)]
    if os.environ.get(PARENT_ENV):
        sys.exit(serve_for_parent(argv, int(os.environ[PARENT_ENV])))
    os.execv(sys.executable, argv)


def serve_for_parent(argv: list[str], parent: int, grace_seconds: float = 10.0) -> int:
    """Run the server as a child and stop it, with every process of this session, when the run ``parent`` is
    gone (even killed by SIGKILL, when nothing of its own cleanup runs) or on SIGTERM/SIGINT. This process leads
    the session the run started it in, so the session is exactly the server's processes."""
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    server = subprocess.Popen(argv)
    while server.poll() is None and not stopping and os.getppid() == parent:
        time.sleep(0.5)
    if server.poll() is not None:
        return server.returncode
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the session-wide signals below are for the others
    os.killpg(0, signal.SIGTERM)  # vLLM stops its engine process on SIGTERM
    try:
        server.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        pass
    os.killpg(0, signal.SIGKILL)  # whatever is left, this process included
    return 0


if __name__ == "__main__":
    main()
