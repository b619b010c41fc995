"""A stand-in for a vLLM server: it answers the routes a served engine uses (generation, the RL weight-update
routes, the weight version) with made-up tokens, so the client and the runs that use it can be tested without vLLM.
Like vLLM with the file transport it reads the weights it is sent from the folder it was told at
``/init_weight_transfer_engine``, and refuses an update before it was told one."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from grpo_rl.engines.vllm_plugin import MODEL_PATH, PROOF_PATH, key_proof


class StandIn:
    """A tiny HTTP server that answers the routes a served engine uses, and records what it was sent.

    ``takes_updates=False`` acknowledges every weight-update call but never changes its version: a server that
    dropped the update. ``delay`` makes generation slower than the client's timeout. ``lora=False``: a server
    without runtime LoRA loading, which refuses ``/v1/load_lora_adapter``.

    Records: ``calls``, ``(path, JSON body)`` of every request; ``queries``, ``(path, query parameters)`` of every
    request (``/pause?mode=keep``); ``weights``, the tensors of the last ``/update_weights`` as read from the file
    (aliases included, by name); ``weight_dir``, the folder it was told; ``adapters``, the LoRA adapters it holds
    (name to folder)."""

    def __init__(
        self,
        *,
        takes_updates: bool = True,
        delay: float = 0.0,
        key: str = "k",
        generations: int | None = None,
        model: dict | None = None,
        lora: bool = True,
    ):
        self.version, self.calls, self.takes_updates, self.delay, self.key = "default", [], takes_updates, delay, key
        self.generations = generations  # answer this many generation calls, then go away (a server that died)
        self.queries: list[tuple[str, dict]] = []
        self.keyed: list[tuple[str, bool]] = []  # (path, whether the request carried a key), in order
        self.model = dict(model or {})  # what /grpo_rl/model reports
        self.weight_dir: str | None = None
        self.weights: dict = {}
        self.lora = lora  # loads adapters (a server started with --enable-lora and runtime LoRA updating)
        self.adapters: dict[str, str] = {}  # name -> folder of the adapters loaded now
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._answer()

            def do_POST(self):
                self._answer()

            def _answer(self):
                path, query = urlsplit(self.path)[2:4]
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stand_in.calls.append((path, json.loads(body) if body else None))
                stand_in.queries.append((path, dict(parse_qsl(query))))
                stand_in.keyed.append((path, self.headers.get("Authorization") is not None))
                if path == PROOF_PATH:  # as RequireKey: answered without the key
                    return self._send(200, {"proof": key_proof(stand_in.key, dict(parse_qsl(query))["nonce"])})
                if self.headers.get("Authorization") != f"Bearer {stand_in.key}":
                    return self._send(401, {"error": "Unauthorized"})
                try:
                    payload = stand_in.route(path, json.loads(body) if body else {})
                except ConnectionAbortedError:
                    self.close_connection = True
                    return
                except RefusedRequest as e:  # vLLM answers a weight update it cannot load with an error
                    return self._send(400, {"error": str(e)})
                self._send(200, payload)

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except BrokenPipeError:  # the client timed out first
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def route(self, path: str, body: dict) -> dict:
        if path == "/weight_info":
            return {"weight_version": self.version}
        if path == MODEL_PATH:
            return self.model
        if path == "/init_weight_transfer_engine":
            self.weight_dir = body["init_info"]["directory"]
        if path == "/update_weights":
            self.weights = self.read_weights(body["update_info"])
        if path == "/update_weight_version" or (path == "/finish_weight_update" and self.takes_updates):
            self.version = body.get("new_version", body.get("weight_version"))
        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            if not self.lora:
                raise RefusedRequest("runtime LoRA updating is off")
            if path.startswith("/v1/load"):
                self.adapters[body["lora_name"]] = body["lora_path"]
            else:
                self.adapters.pop(body["lora_name"])
        if path == "/inference/v1/generate":
            if body.get("model") is not None and body["model"] not in self.adapters:
                raise RefusedRequest(f"no adapter {body['model']}")
            time.sleep(self.delay)
            if self.generations is not None:
                self.generations -= 1
                if self.generations < 0:
                    threading.Thread(target=self.close, daemon=True).start()
                    raise ConnectionAbortedError("gone")
            n, prompt = body["sampling_params"]["n"], body["token_ids"]
            # answer k of a prompt: k + 1 tokens; the last one sampled after a push to version 7
            return {
                "choices": [
                    {
                        "index": k,
                        "token_ids": [prompt[0] + k + j for j in range(k + 1)],
                        "finish_reason": "length" if k == n - 1 else "stop",
                        "logprobs": {"content": [{"logprob": -0.5 - j} for j in range(k + 1)]},
                        "weight_versions": [
                            {"version": "3", "start": 0, "end": k},
                            {"version": "7", "start": k, "end": k + 1},
                        ],
                    }
                    for k in reversed(range(n))
                ]
            }  # out of order: the client sorts by index
        return {}

    def read_weights(self, info: dict) -> dict:
        """The tensors of an ``/update_weights`` call, read from the file it names in the folder this server was
        told, each alias under its own name too."""
        from safetensors.torch import load

        from grpo_rl.engines.weight_folder import read_weight_file

        if self.weight_dir is None:
            raise RefusedRequest("the weight transfer engine was not initialised (/init_weight_transfer_engine)")
        file = Path(self.weight_dir) / info["file"]
        try:  # as the server's transport: no symlink, a regular file, the trainer's SHA-256
            tensors = load(read_weight_file(Path(self.weight_dir), info["file"], info["sha256"]))
        except (OSError, ValueError) as e:
            raise RefusedRequest(str(e)) from e
        if len(tensors) != info["num_tensors"]:
            raise RefusedRequest(f"{file} holds {len(tensors)} tensors, not {info['num_tensors']}")
        return {**tensors, **{alias: tensors[name] for alias, name in info.get("aliases", {}).items()}}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class RefusedRequest(Exception):
    """A request the stand-in answers with an error, as vLLM would."""
