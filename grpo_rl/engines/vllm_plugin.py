"""What a vLLM server needs from this library: a weight transport that works without a GPU, and a key on every path.

Loaded inside the server's processes, never by the learner:

* :func:`register` is a vLLM general plugin (the ``vllm.general_plugins`` entry point in ``pyproject.toml``), which
  vLLM calls in every process it starts (API server, engine core, workers). It registers
  :class:`~grpo_rl.engines.file_transfer.SharedFileWeightTransfer` as the weight-transfer backend ``grpo_rl_file``, chosen on the command line with
  ``--weight-transfer-config '{"backend": "grpo_rl_file"}'``.
* :class:`RequireKey` is the ASGI middleware given with ``--middleware grpo_rl.engines.vllm_plugin.RequireKey``.
  vLLM's own ``--api-key`` guards only ``/v1``, ``/v2``, ``/inference`` and ``/cohere``: the weight-update routes
  (``/pause``, ``/update_weights``, ``/collective_rpc``, ...) stay open, so anyone who reaches the port could replace
  the model. This middleware refuses every path, ``/health`` included, without ``Authorization: Bearer <key>``; the
  key is read from ``GRPO_RL_ENGINE_KEY`` and the server refuses to start without one.

The transport. The learner writes its weights as one safetensors file into a folder both sides can read (``/dev/shm``
on one machine: memory, not disk) and names the file in ``/update_weights``; the worker maps it and loads the tensors
through vLLM's layerwise reload, the same path as its CUDA IPC backend. safetensors holds raw tensors only, so a file
cannot run code when read, unlike a pickle. The file is named relative to the folder fixed at
``/init_weight_transfer_engine`` and must not leave it. Between GPUs the run uses vLLM's own NCCL backend instead.
"""
from __future__ import annotations

import hashlib
import os
import secrets

KEY_ENV = "GRPO_RL_ENGINE_KEY"
PARENT_ENV = "GRPO_RL_SERVE_PARENT"
"""Set by a run for the servers it starts: the run's process id, whose death stops them (grpo_rl.cli.serve)."""
BACKEND = "grpo_rl_file"


def register() -> None:
    """Register the ``grpo_rl_file`` weight-transfer backend (idempotent: vLLM calls plugins once per process)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, "grpo_rl.engines.file_transfer", "SharedFileWeightTransfer")


class RequireKey:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer $GRPO_RL_ENGINE_KEY``."""

    def __init__(self, app) -> None:
        key = os.environ.get(KEY_ENV, "")
        if not key:
            raise RuntimeError(f"{KEY_ENV} is not set: a server with weight-update routes needs a key")
        self.app = app
        self.digest = hashlib.sha256(key.encode()).digest()

    def _authorised(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and secrets.compare_digest(
                    hashlib.sha256(token.encode()).digest(), self.digest)
        return False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket") and not self._authorised(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"error": "Unauthorized"}'})
            return
        await self.app(scope, receive, send)
