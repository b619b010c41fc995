"""A rollout engine made of vLLM servers (``inference_model.engine=vllm_server``), spoken to over HTTP.

The servers are the run's own (:mod:`grpo_rl.engines.server`) or the user's (``inference_model.urls``, started with
``python -m grpo_rl.cli.serve``). :class:`ServedEngine` is a :class:`~grpo_rl.engines.base.RolloutEngine` like the
in-process one, with the same batch layout and the same sampling:

* **Generation** goes through vLLM's token-in/token-out route ``/inference/v1/generate``: one request per prompt
  with ``n`` answers, the prompt as token ids, seeded ``seed + i * n`` for prompt ``i`` as in-process, stop strings
  kept in the answer, and the sampled tokens' ``processed_logprobs`` (after temperature, top-k and top-p). Prompts
  are spread over the servers, prompt ``i`` to server ``i % S``, all in flight at once.
* **Per-token versions.** The server reports which weight version sampled each token (``weight_versions`` spans).
  The batch gets them as ``behavior_version`` ``[N, Lr]``: with in-flight updates one answer may hold tokens of
  two versions, each with the log-prob of the weights that sampled it.
* **Weights** go through vLLM's RL routes: ``/pause``, ``/start_weight_update``, ``/update_weights``,
  ``/finish_weight_update`` (which sets the weight version), ``/resume``. The CPU transport writes one safetensors
  file into a private folder in ``/dev/shm`` that the server maps (:mod:`grpo_rl.engines.file_transfer`); between
  GPUs, vLLM's own NCCL trainer engine broadcasts. A push pauses with ``wait`` (nothing is in flight between two
  batches) or, for in-flight updates, with ``keep``: requests freeze, the weights change under them, and they go on
  after ``/resume``; the prefix cache is reset so no new request reuses keys and values of the old weights.
* **LoRA adapters** (``model.lora.push=adapter``): a push that carries an adapter alone is written as a peft folder
  beside the weight files and loaded by every server as a new adapter (``/v1/load_lora_adapter``; the servers run
  with ``--enable-lora``); each generation request names the newest adapter, so an answer keeps the adapter, and
  the version, it started with, also across a push. Adapters no request may name any more are unloaded.
* **Verified.** After every push each server's ``/weight_info`` must report the pushed version; a server that did
  not take it ends the run with a message naming it.
* **Never hangs.** Every request has ``inference_model.request_timeout_s``; a server that does not answer, refuses,
  or is gone is named in one line (:class:`~grpo_rl.errors.RoleFailed`), and the run checkpoints and ends.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from itertools import islice
from pathlib import Path

import torch
from tensordict import TensorDict

from grpo_rl.engines.base import GroupRequest, SamplingSpec, check_room, pack_rollouts, split_aliases
from grpo_rl.engines.server_client import ServerClient
from grpo_rl.engines.vllm_engine import AdapterSlots, AdapterVersions
from grpo_rl.engines.weight_folder import RunFolder, check_weight_dir, default_parent
from grpo_rl.errors import RoleFailed
from grpo_rl.model.lora import is_adapter_push

log = logging.getLogger(__name__)


class ServedEngine:
    """A :class:`~grpo_rl.engines.base.RolloutEngine` over one or more vLLM servers.

    Args:
        urls: the servers' base URLs.
        key: the bearer key they require (None: no key, for a server without one).
        pad_id: token id used for padding.
        dtype: the servers' weight dtype (pushed weights are cast to it).
        timeout: seconds any request may take.
        inflight: push with ``/pause?mode=keep``, under requests in flight (``pipeline.inflight_updates``).
        transport: ``file`` (a shared folder, the CPU transport) or ``nccl`` (vLLM's NCCL engine, GPUs).
        weight_dir: a folder the servers also see, in which the file transport makes a private folder of its own
            (default: ``/dev/shm``); refused with a :class:`~grpo_rl.errors.ConfigError` if another user can write to
            it (:func:`~grpo_rl.engines.weight_folder.check_weight_dir`).
        version: the version of the weights the servers hold now; they are stamped with it.
        ca_certs: a CA bundle that verifies ``https`` servers' certificates (None: the system's).
        model: what the servers must hold (:func:`~grpo_rl.engines.server_client.model_identity`), checked before
            anything is sent to them (None: not checked).
        adapters: the LoRA adapters pushes carry (the servers were started with ``--enable-lora``); None: pushes
            carry whole weights.
    """

    # Until __init__ sets them: shutdown() may follow a failed start.
    servers: list[ServerClient] = []
    _pool: ThreadPoolExecutor | None = None
    _weight_folder: RunFolder | None = None
    _adapters: AdapterVersions | None = None

    def __init__(
        self,
        urls: Sequence[str],
        *,
        key: str | None,
        pad_id: int,
        dtype: str = "float32",
        timeout: float = 600.0,
        inflight: bool = False,
        transport: str = "file",
        weight_dir: str | None = None,
        version: int = 0,
        ca_certs: str | None = None,
        model: dict | None = None,
        adapters: AdapterSlots | None = None,
    ):
        if not urls:
            raise ValueError("a served engine needs at least one server URL")
        self.servers = [ServerClient(u, key, timeout, ca_certs) for u in urls]
        self.model = model
        self.pad_id, self.dtype = pad_id, getattr(torch, dtype)
        self.inflight, self.transport = inflight, transport
        self.version = version
        # the file transport's folder: a private one made at the first push, in a parent checked before any server
        # is contacted (a shared weight_dir must not let another user swap the files)
        self._weight_parent: Path | None = None
        if transport == "file":
            self._weight_parent = check_weight_dir(weight_dir) if weight_dir else default_parent()
        self._weight_folder: RunFolder | None = None
        self._file_ready = False  # the servers were told the weight folder
        self._nccl = None
        self._push_lock = threading.Lock()
        self._adapter_slots, self._adapters = adapters, None
        self._adapter: tuple[str, int] | None = None  # the newest adapter's name and version: what requests name
        self._loaded: list[set[str]] = [set() for _ in urls]  # the adapters each server holds
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="served-engine")
        self._each(self._check)
        self._each(lambda s: s.post("/update_weight_version", json={"new_version": str(version)}))

    def _check(self, server: ServerClient) -> None:
        """The server holds the key (proved without sending it) and, where known, the run's model."""
        server.verify()
        if self.model:
            server.check_model(self.model)

    def replace_server(self, index: int, url: str) -> None:
        """Server ``index`` was started again at ``url``: talk to that one from now on (it is told the weight folder
        at the next push, which must follow before it generates)."""
        if self.transport == "nccl":
            raise RoleFailed(
                "an engine server was lost and inference_model.weight_transfer=nccl cannot reach a new "
                "one (its group is fixed at start): use weight_transfer=file to have it replaced"
            )
        old = self.servers[index]
        new = ServerClient(url, old.key, old.timeout, old.ca_certs)
        self._check(new)
        self.servers[index] = new
        self._loaded[index] = set()
        old.close()
        self._file_ready = False

    # --- generation -------------------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSpec) -> TensorDict:
        futures = [
            self._submit(i, p, n, sampling, None if sampling.seed is None else sampling.seed + i * n)
            for i, p in enumerate(prompts)
        ]
        answers = [self._answers(f.result(), n) for f in futures]
        return self._pack(prompts, answers, n)

    def stream(
        self, requests: Iterable[GroupRequest], n: int, sampling: SamplingSpec, max_in_flight: int
    ) -> Iterator[tuple[int, TensorDict]]:
        """One HTTP request per group, up to ``max_in_flight`` at a time, each group yielded when its reply comes."""
        check_room(max_in_flight)
        pending, in_flight, sent = iter(requests), {}, 0
        try:
            while True:
                for request in islice(pending, max_in_flight - len(in_flight)):
                    in_flight[self._submit(sent, request.prompt, n, sampling, request.seed)] = request
                    sent += 1
                if not in_flight:
                    return
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    request = in_flight.pop(future)
                    yield request.key, self._pack([request.prompt], [self._answers(future.result(), n)], n)
        finally:
            for future in in_flight:  # the caller stopped early: replies still on their way are not read
                future.cancel()

    def _submit(self, i: int, prompt: Sequence[int], n: int, sampling: SamplingSpec, seed: int | None) -> Future:
        """Send one prompt's request to server ``i`` modulo the servers."""
        server = self.servers[i % len(self.servers)]
        body = self._request(prompt, n, sampling, seed)
        adapter = self._adapter
        if adapter is None:
            return self._pool.submit(server.post, "/inference/v1/generate", json=body)
        body["model"] = adapter[0]  # every token of this answer comes from this adapter, whatever is pushed meanwhile

        def post() -> dict:
            return {**server.post("/inference/v1/generate", json=body), "adapter_version": adapter[1]}

        return self._pool.submit(post)

    def _answers(self, reply: dict, n: int) -> list[tuple[list[int], list[float], bool, list[int]]]:
        """A reply's ``n`` answers as ``(token ids, log-probs, truncated, versions)``, in answer order."""
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        if len(choices) != n:
            raise RoleFailed(f"an engine server returned {len(choices)} answers where {n} were asked for")
        out = []
        for choice in choices:
            ids = list(choice["token_ids"] or [])
            logprobs = [step["logprob"] for step in (choice["logprobs"] or {}).get("content") or []]
            if "adapter_version" in reply:  # sampled with one adapter from first token to last
                versions = [reply["adapter_version"]] * len(ids)
            else:
                versions = self._token_versions(choice.get("weight_versions"), len(ids))
            out.append((ids, logprobs, choice["finish_reason"] == "length", versions))
        return out

    def _pack(self, prompts: Sequence[Sequence[int]], answers: list[list[tuple]], n: int) -> TensorDict:
        rows = [a for group in answers for a in group]
        return pack_rollouts(
            prompts,
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            n,
            self.pad_id,
            versions=[r[3] for r in rows],
        )

    @staticmethod
    def _request(prompt: Sequence[int], n: int, sampling: SamplingSpec, seed: int | None) -> dict:
        params = {
            "n": n,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "logprobs": 0,
            "include_stop_str_in_output": True,
            "detokenize": bool(sampling.stop),
        }
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        if seed is not None:
            params["seed"] = seed
        return {"token_ids": list(prompt), "sampling_params": params}

    def _token_versions(self, spans: list[dict] | None, length: int) -> list[int]:
        """The version that sampled each of ``length`` tokens, from the server's ``weight_versions`` spans."""
        out = [self.version] * length
        for span in spans or ():
            try:
                v = int(span["version"])
            except ValueError:  # a server not yet stamped by this run ("default"): its first weights
                v = 0
            out[span["start"] : span["end"]] = [v] * (min(span["end"], length) - span["start"])
        return out

    # --- weights ----------------------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Push ``named_tensors`` to every server as ``version`` (default: one past the last) and check it landed."""
        version = self.version + 1 if version is None else version
        with self._push_lock:
            named_tensors = list(named_tensors)
            if is_adapter_push(name for name, _ in named_tensors):
                self._push_adapter(named_tensors, version)
                self.version = version
                return
            unique, aliases = split_aliases(named_tensors)
            if self.transport == "nccl":
                self._push_nccl(unique, aliases, version)
            else:
                self._push_file(unique, aliases, version)
            self._each(lambda s: self._check_version(s, version))
            self.version = version

    def _push_file(self, unique: dict[str, torch.Tensor], aliases: dict[str, str], version: int) -> None:
        """One safetensors file in the run's folder (:mod:`~grpo_rl.engines.weight_folder`), named with its SHA-256
        in the update, loaded by every server, then removed."""
        from safetensors.torch import save

        folder = self._folder()
        tensors = {k: v.detach().to("cpu", self.dtype).contiguous() for k, v in unique.items()}
        data = save(tensors)
        name = folder.write(data, stem=f"weights_v{version}")
        info = {
            "file": name,
            "num_tensors": len(tensors),
            "aliases": aliases,
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        del tensors, data  # the in-memory copy need not outlive the write while the servers load
        try:
            self._each(
                lambda s: self._paused(s, lambda: s.post("/update_weights", json={"update_info": info}), version)
            )
        finally:
            folder.remove(name)

    def _push_adapter(self, weights: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Write the adapter as a peft folder the servers read, load it on every server under a new name, unload
        those no request may name any more, and stamp the servers with ``version``."""
        if self._adapter_slots is None:
            raise RuntimeError("an adapter push reached a served engine started without adapters (model.lora.push)")
        if self._adapters is None:
            self._adapters = AdapterVersions(self._adapter_slots, self._weight_parent)
        request = self._adapters.add([(n, t.detach().to("cpu", self.dtype)) for n, t in weights], version)
        retired = self._adapters.retired

        def load(index: int) -> None:
            server, loaded = self.servers[index], self._loaded[index]
            try:
                server.post(
                    "/v1/load_lora_adapter", json={"lora_name": request.lora_name, "lora_path": request.lora_path}
                )
            except RoleFailed as e:
                raise RoleFailed(
                    f"{e}: a server that takes adapter pushes is started with python -m grpo_rl.cli.serve ... "
                    "--enable-lora (servers a run starts are), or set model.lora.push=merged"
                ) from e
            loaded.add(request.lora_name)
            for name in loaded.intersection(retired):
                server.post("/v1/unload_lora_adapter", json={"lora_name": name})
                loaded.discard(name)
            server.post("/update_weight_version", json={"new_version": str(version)})
            self._check_version(server, version)

        for future in [self._pool.submit(load, i) for i in range(len(self.servers))]:
            future.result()
        self._adapter = (request.lora_name, version)

    def _folder(self) -> RunFolder:
        """The run's weight folder, made (and stale ones swept) at the first push; servers that were not told it
        yet are told now."""
        if self._weight_folder is None:
            assert self._weight_parent is not None, "the file transport's folder is set in __init__"
            self._weight_folder = RunFolder(self._weight_parent)
        if not self._file_ready:
            directory = str(self._weight_folder.path)
            self._each(lambda s: s.post("/init_weight_transfer_engine", json={"init_info": {"directory": directory}}))
            self._file_ready = True
        return self._weight_folder

    def _push_nccl(self, unique: dict[str, torch.Tensor], aliases: dict[str, str], version: int) -> None:
        if len(self.servers) != 1:  # preflight refuses the config (check_engine)
            raise ValueError("the nccl transport drives one server per engine")
        server = self.servers[0]
        tensors = {**unique, **{alias: unique[name] for alias, name in aliases.items()}}
        if self._nccl is None:
            self._nccl = _nccl_sender(server, tensors)
        self._nccl.source.tensors = tensors
        # send_weights opens and closes the update session itself; the version is set after it
        self._paused(server, self._nccl.send_weights, version, started=False)

    def _paused(self, server: ServerClient, update, version: int, started: bool = True) -> None:
        """Pause ``server``, run ``update`` inside a weight-update session, set ``version``, resume."""
        server.post("/pause", params={"mode": "keep" if self.inflight else "wait"})
        try:
            if started:
                server.post("/start_weight_update")
            update()
            if started:
                server.post("/finish_weight_update", json={"weight_version": str(version)})
            else:
                server.post("/update_weight_version", json={"new_version": str(version)})
            server.post("/reset_prefix_cache")  # no new request may reuse keys and values of the old weights
        finally:
            server.post("/resume")

    @staticmethod
    def _check_version(server: ServerClient, version: int) -> None:
        held = server.weight_version()
        if held != str(version):
            raise RoleFailed(
                f"engine server {server.url} reports weight version {held} after the push of version "
                f"{version}: the update did not land"
            )

    def _each(self, fn) -> None:
        """``fn(server)`` on every server at once; the first failure is raised."""
        for future in [self._pool.submit(fn, s) for s in self.servers]:
            future.result()

    def shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for server in self.servers:
            server.close()
        folder, self._weight_folder = self._weight_folder, None
        if folder is not None:
            folder.close()
        adapters, self._adapters = self._adapters, None
        if adapters is not None:
            adapters.close()


def _nccl_sender(server: ServerClient, tensors: dict[str, torch.Tensor]):
    """vLLM's own trainer-side NCCL engine, rank 0 of a group with the server's one worker (GPU runs only)."""
    import os

    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    from grpo_rl.engines.server import free_port
    from grpo_rl.placement.ray import interface_with_address

    class Control:  # vLLM's sync-client protocol, over our keyed client
        def init_weight_transfer_engine(self, init_info):
            server.post("/init_weight_transfer_engine", json={"init_info": init_info})

        def start_weight_update(self):
            server.post("/start_weight_update")

        def update_weights(self, update_info):
            server.post("/update_weights", json={"update_info": update_info})

        def finish_weight_update(self, weight_version=None):
            server.post("/finish_weight_update", json={"weight_version": weight_version})

    class Source(WeightSource):  # the weights of the current push, replaced before each send
        def __init__(self, tensors):
            self.tensors = tensors

        def metadata(self):
            return [ParamMeta(name=k, dtype=t.dtype, shape=tuple(t.shape)) for k, t in self.tensors.items()]

        def __iter__(self):
            return iter(self.tensors.items())

    host = server.url.split("//", 1)[1].rsplit(":", 1)[0]
    master = "127.0.0.1" if host in ("127.0.0.1", "localhost") else socket_address_towards(host)
    # vLLM's store listens on ``master`` only, but NCCL's own sockets (bootstrap, proxy) take their interface from
    # the environment alone, read when NCCL first starts in this process: loopback for a server on this machine
    os.environ["NCCL_SOCKET_IFNAME"] = interface_with_address(master)
    info = NCCLTrainerInitInfo(master_address=master, master_port=free_port(master), world_size=2)
    return WeightTransferTrainerFactory.trainer_init(info, client=Control(), source=Source(tensors))


def socket_address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (what a remote server connects back to)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]
