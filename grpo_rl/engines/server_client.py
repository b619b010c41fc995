"""The HTTP client of one engine server, which sends the run's key only to a server that proved it holds it.

A server is addressed as ``unix:/PATH`` (the run's own servers: a Unix socket in a folder only this user can
enter, so no other local user can reach it, bind it first, or read what crosses it), ``https://HOST:PORT`` (TLS,
the certificate verified) or ``http://HOST:PORT`` (loopback, or another machine only where the user allowed the key
and weights to cross the network unencrypted; see ``inference_model.allow_unencrypted_network``).

The key never goes first. Before a client sends it, :meth:`ServerClient.verify` asks ``/grpo_rl/proof`` with a fresh
nonce and checks the answer against ``HMAC-SHA256(key, nonce)`` (:func:`~grpo_rl.engines.vllm_plugin.key_proof`):
a process that took the port before the server, a server started with another key, or anything that is not a
server of ``python -m grpo_rl.cli.serve`` cannot answer it, and is named in one line before the key leaves this
process. Proxies from the environment (``HTTP(S)_PROXY``) are ignored for loopback and Unix sockets, where a
proxy would be handed the key.
"""

from __future__ import annotations

import json
import logging
import secrets

from grpo_rl.config.checks import is_loopback
from grpo_rl.engines.vllm_plugin import KEY_ENV, MODEL_FIELDS, MODEL_PATH, PROOF_PATH, key_proof
from grpo_rl.errors import RoleFailed

log = logging.getLogger(__name__)

SERVE_HINT = (
    "start one with: GRPO_RL_ENGINE_KEY=<key> python -m grpo_rl.cli.serve --model MODEL_DIR --port PORT "
    "(docs/pipeline.md, 'Server mode')"
)

# How long an idle pooled connection is reused. vLLM's server closes one after VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s),
# httpx's own default is the same 5 s: a request sent on a connection the server is closing at that moment fails
# with "Server disconnected without sending a response". Dropping idle connections well before the server does
# costs a reconnect (a Unix socket or a TLS handshake) and removes the race.
IDLE_CONNECTION_SECONDS = 2.0


class ServerClient:
    """One server's HTTP client: every call has a timeout, every failure names the server in one line.

    Args:
        url: ``unix:/PATH``, ``http://HOST:PORT`` or ``https://HOST:PORT``.
        key: the bearer key (None: a server without one; never sent before :meth:`verify` passed).
        ca_certs: a CA bundle that verifies an ``https`` server's certificate (None: the system's).
    """

    def __init__(self, url: str, key: str | None, timeout: float, ca_certs: str | None = None):
        import httpx

        self.url = url.rstrip("/")
        self.key, self.timeout, self.ca_certs = key, timeout, ca_certs
        limits = httpx.Limits(
            max_connections=256, max_keepalive_connections=64, keepalive_expiry=IDLE_CONNECTION_SECONDS
        )
        if self.url.startswith("unix:"):
            transport = httpx.HTTPTransport(uds=self.url[len("unix:") :], limits=limits)
            self._http = httpx.Client(
                base_url="http://localhost", transport=transport, timeout=timeout, trust_env=False
            )
        else:
            self._http = httpx.Client(
                base_url=self.url,
                timeout=timeout,
                limits=limits,
                verify=ca_certs or True,
                trust_env=not is_loopback(self.url),
            )
        self.verified = key is None  # a keyless server has nothing to prove

    def verify(self) -> None:
        """Check that the server holds the key, without sending it; raises :class:`RoleFailed` naming the URL."""
        if self.verified:
            return
        nonce = secrets.token_hex(16)
        response = self._request("GET", PROOF_PATH, params={"nonce": nonce})
        try:
            proof = response.json().get("proof")
        except (ValueError, AttributeError):
            proof = None
        if response.status_code != 200 or not isinstance(proof, str):
            raise RoleFailed(
                f"engine server {self.url} answers (HTTP {response.status_code}) but is not a server "
                f"started by python -m grpo_rl.cli.serve; {SERVE_HINT}"
            )
        if not secrets.compare_digest(proof, key_proof(self.key, nonce)):
            raise RoleFailed(
                f"engine server {self.url} was started with another key than the run's: give the run "
                f"the key the server was started with ({KEY_ENV}); the key was not sent"
            )
        self.verified = True

    def proves_key(self) -> bool:
        """Whether the server answers and holds the key (nothing raised: for polls while a server starts)."""
        try:
            self.verify()
            return True
        except RoleFailed:
            return False

    def call(self, method: str, path: str, **kwargs) -> dict:
        self.verify()
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        response = self._request(method, path, headers=headers, **kwargs)
        if response.status_code == 401:
            raise RoleFailed(
                f"engine server {self.url} refused the key (401): give the run the key the server was "
                f"started with ({KEY_ENV})"
            )
        if response.status_code >= 400:
            raise RoleFailed(
                f"engine server {self.url} failed {path}: HTTP {response.status_code}{_short_reason(response)}"
            )
        if not response.content or "json" not in response.headers.get("content-type", ""):
            return {}  # vLLM answers some routes in plain text ("Success: LoRA adapter ... added")
        return response.json()

    def _request(self, method: str, path: str, **kwargs):
        import httpx

        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as e:
            raise RoleFailed(
                f"engine server {self.url} did not answer {path} within "
                f"inference_model.request_timeout_s={self.timeout:g}"
            ) from e
        except httpx.HTTPError as e:
            raise RoleFailed(
                f"engine server {self.url} is not reachable ({path}: {type(e).__name__}: {_first_line(str(e))})"
            ) from e

    def post(self, path: str, **kwargs) -> dict:
        return self.call("POST", path, **kwargs)

    def get(self, path: str, **kwargs) -> dict:
        return self.call("GET", path, **kwargs)

    def weight_version(self) -> str:
        return str(self.get("/weight_info").get("weight_version"))

    def check_model(self, expected: dict) -> None:
        """Raise :class:`RoleFailed` if the server holds another model than ``expected`` (:func:`model_identity`)."""
        held = self.get(MODEL_PATH)
        differ = [k for k in MODEL_FIELDS if k in held and k in expected and held[k] != expected[k]]
        if differ:
            what = ", ".join(f"{k} {held[k]} there, {expected[k]} in the run's model" for k in differ)
            raise RoleFailed(
                f"engine server {self.url} holds another model than the run's ({what}): start it with "
                f"--model set to the run's model folder"
            )

    def close(self) -> None:
        self._http.close()


def model_identity(model_path: str) -> dict:
    """:data:`~grpo_rl.engines.vllm_plugin.MODEL_FIELDS` of the HF folder ``model_path`` (its config.json)."""
    from pathlib import Path

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):  # not a folder this process sees (an actor on another machine): not checked
        return {}
    config = {**config.get("text_config", {}), **config}
    return {k: config[k] for k in MODEL_FIELDS if config.get(k) is not None}


def _short_reason(response) -> str:
    """The server's own reason in a few words (a JSON error's message), never a whole page."""
    try:
        body = response.json()
    except ValueError:
        return ""
    message = body.get("error") or body.get("detail") or body.get("message") if isinstance(body, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    return f": {_first_line(str(message))[:200]}" if message else ""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
