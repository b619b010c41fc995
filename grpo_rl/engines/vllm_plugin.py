"""What a vLLM server needs from this library: a weight transport that works without a GPU, and a key on every path.

Loaded inside the server's processes, never by the learner:

* :func:`register` is a vLLM general plugin (the ``vllm.general_plugins`` entry point in ``pyproject.toml``), which
  vLLM calls in every process it starts (API server, engine core, workers). It registers
  :class:`~grpo_rl.engines.file_transfer.SharedFileWeightTransfer` as the weight-transfer backend ``grpo_rl_file``,
  chosen on the command line with ``--weight-transfer-config '{"backend": "grpo_rl_file"}'``.
* :class:`RequireKey` is the ASGI middleware given with ``--middleware grpo_rl.engines.vllm_plugin.RequireKey``.
  vLLM's own ``--api-key`` guards only ``/v1``, ``/v2``, ``/inference`` and ``/cohere``: the weight-update routes
  (``/pause``, ``/update_weights``, ``/collective_rpc``, ...) stay open, so anyone who reaches the port could replace
  the model. This middleware refuses every path, ``/health`` included, without ``Authorization: Bearer <key>``; the
  key is read from ``GRPO_RL_ENGINE_KEY`` and the server refuses to start without one. It is the outermost layer of
  the app's own stack (vLLM adds ``--middleware`` last), so no route, mount or websocket is reached without it.
  Two routes are its own: ``GET /grpo_rl/proof?nonce=N`` answers, without the key, ``HMAC-SHA256(key, N)``, so a
  client can tell that a socket is a server holding its key before it sends the key (:func:`key_proof`);
  ``GET /grpo_rl/model``, behind the key, names the model the server holds (architecture and sizes), so a run can
  refuse a server of another model before its first push.

The transport. The learner writes its weights as one safetensors file into a folder both sides can read (``/dev/shm``
on one machine: memory, not disk) and names the file in ``/update_weights``; the worker maps it and loads the tensors
through vLLM's layerwise reload, the same path as its CUDA IPC backend. safetensors holds raw tensors only, so a file
cannot run code when read, unlike a pickle. The file is named relative to the folder fixed at
``/init_weight_transfer_engine`` and must not leave it. Between GPUs the run uses vLLM's own NCCL backend instead.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from urllib.parse import parse_qs

KEY_ENV = "GRPO_RL_ENGINE_KEY"
PARENT_ENV = "GRPO_RL_SERVE_PARENT"
"""Set by a run for the servers it starts: the run's process id, whose death stops them (grpo_rl.cli.serve)."""
BACKEND = "grpo_rl_file"
MIN_KEY_LENGTH = 32
"""Characters a key needs at least (``secrets.token_urlsafe(32)`` gives 43)."""
PROOF_PATH = "/grpo_rl/proof"
MODEL_PATH = "/grpo_rl/model"
MODEL_FIELDS = (
    "architectures",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
)
"""What says which model a server holds: two sizes of one family share the architecture and the vocabulary."""


def key_proof(key: str, nonce: str) -> str:
    """What a server holding ``key`` answers to ``nonce``: neither reveals the key, and no one without it can answer."""
    return hmac.new(key.encode(), b"grpo_rl-proof:" + nonce.encode(), hashlib.sha256).hexdigest()


def register() -> None:
    """Register the ``grpo_rl_file`` weight-transfer backend (idempotent: vLLM calls plugins once per process)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "grpo_rl.engines.file_transfer", "SharedFileWeightTransfer"
        )


class RequireKey:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer $GRPO_RL_ENGINE_KEY``."""

    def __init__(self, app) -> None:
        key = os.environ.get(KEY_ENV, "")
        if not key:
            raise RuntimeError(f"{KEY_ENV} is not set: a server with weight-update routes needs a key")
        self.app, self.key = app, key
        self.digest = hashlib.sha256(key.encode()).digest()

    def _authorised(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and secrets.compare_digest(
                    hashlib.sha256(token.encode()).digest(), self.digest
                )
        return False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            return await self.app(scope, receive, send)
        if scope["type"] == "http" and scope.get("path") == PROOF_PATH:
            nonce = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("nonce", [""])[0]
            if not 16 <= len(nonce) <= 128:
                return await _reply(send, 400, {"error": "nonce of 16 to 128 characters required"})
            return await _reply(send, 200, {"proof": key_proof(self.key, nonce)})
        if not self._authorised(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            return await _reply(send, 401, {"error": "Unauthorized"})
        if scope["type"] == "http" and scope.get("path") == MODEL_PATH:
            return await _reply(send, 200, _served_model(scope))
        await self.app(scope, receive, send)


async def _reply(send, status: int, payload: dict) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


def _served_model(scope) -> dict:
    """:data:`MODEL_FIELDS` of the model this server holds (vLLM keeps its config in the app's state)."""
    try:
        hf_config = scope["app"].state.vllm_config.model_config.hf_config
    except (KeyError, AttributeError):
        return {}
    return {k: getattr(hf_config, k) for k in MODEL_FIELDS if getattr(hf_config, k, None) is not None}
