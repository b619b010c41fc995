"""vLLM rollout engine, run in the caller's process.

Why in-process: on a CPU box of a few cores the synchronous loop alternates generation and training, so a second
process buys no overlap, and it costs a slower start plus a serialisation of the weights on every push (tensors
sent through ``collective_rpc`` to another process arrive as lists). In-process, a weight push is an in-place
reload of the engine's own tensors (start and push times: benchmarks/README.md, "Measurements behind library
defaults"). The asynchronous loop gets its process separation from Ray instead: it puts this same class inside an
actor.

What in-process vLLM does to its host process, which the learner must know:

* it replaces ``torch.set_num_threads`` with a no-op and binds OpenMP threads; we set ``OMP_NUM_THREADS``
  to the current torch thread count first so that vLLM keeps it instead of dropping to one thread;
* it starts a one-rank gloo process group and seeds the global RNGs with ``seed``.

Weights are loaded with the worker's ``reload_weights`` (a plain ``model.load_weights`` fails on the CPU,
where linear weights are repacked) and the prefix cache is reset afterwards: cached keys and values of the
old weights would otherwise be reused for shared prompt prefixes. Each reload makes vLLM warn that the rotary
cache was not in the weights (it is a buffer; vLLM keeps its own, the correct result): :mod:`grpo_rl.quiet`
drops that line with the other known start-up noise.

A LoRA run whose pushes carry the adapter alone (``model.lora.push``, :mod:`grpo_rl.model.lora`) starts the engine
with ``enable_lora``: each push becomes a new adapter version (:class:`AdapterVersions`), every request added after
it samples with it, and a request keeps the version it started with to its end, so an answer never changes adapter
part-way (the slots hold as many versions as the staleness bound lets be in flight at once).

Log-probs are ``processed_logprobs``: log-softmax of the logits the sampler drew from, temperature-scaled and
then truncated by top-k and top-p (tokens outside get -inf, the kept ones are renormalised), which is what the
learner recomputes (``logits / temperature`` under the same truncation, :mod:`grpo_rl.model.vocab`).
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import get_args

import torch
from tensordict import TensorDict

from grpo_rl import quiet
from grpo_rl.engines.base import GroupRequest, SamplingSpec, check_room, pack_rollouts
from grpo_rl.engines.weight_folder import RunFolder, default_parent
from grpo_rl.model.lora import is_adapter_push, write_adapter
from grpo_rl.placement.ray import on_loopback

log = logging.getLogger(__name__)


class VLLMEngine:
    """A ``RolloutEngine`` over ``vllm.LLM``.

    Args:
        max_model_len: longest prompt + answer.
        seed: engine seed (also used for requests without their own seed).
        kv_cache_gb: KV cache size on the CPU, in GiB (fractions allowed); ``gpu_memory_utilization`` on a GPU.
        enforce_eager: skip CUDA-graph capture / compilation.
    """

    llm = None  # until vLLM is up: shutdown() may follow a failed start

    def __init__(
        self,
        model_path: str,
        device: torch.device,
        *,
        dtype: str = "float32",
        max_model_len: int = 1024,
        seed: int = 0,
        kv_cache_gb: float = 1.0,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = True,
        adapters: AdapterSlots | None = None,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        if device.type != "cpu" and device.index is not None:
            # vLLM addresses "the" GPU of its process; pick ours before it initialises CUDA.
            os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(device.index))
        quiet.vllm_logging_config()  # vLLM's default logging, less its known start-up noise
        from vllm import LLM

        self.device = device
        self.dtype = getattr(torch, dtype)
        # vLLM collects garbage several times while it starts (and freezes its heap after); every object alive now
        # (imports, the learner's model) lives as long as the process, so freezing them first spares those
        # collections the walk over them: SmolLM2-135M's engine started in 5.3 s instead of 6.9 on a 2-core AMD EPYC
        # with AVX2 (benchmarks/micro/engine_start.py).
        gc.freeze()
        lora = {}
        if adapters is not None:
            lora = dict(enable_lora=True, max_lora_rank=adapters.max_rank, max_loras=adapters.slots)
        with on_loopback():  # vLLM's one-rank group listens only on loopback, whatever the host name resolves to
            self.llm = LLM(
                model=model_path,
                dtype=dtype,
                max_model_len=max_model_len,
                seed=seed,
                enforce_eager=enforce_eager,
                enable_prefix_caching=enable_prefix_caching,
                logprobs_mode="processed_logprobs",
                gpu_memory_utilization=gpu_memory_utilization,
                # On the CPU an explicit size in bytes: VLLM_CPU_KVCACHE_SPACE only takes whole GiB (>= 1).
                kv_cache_memory_bytes=int(kv_cache_gb * 2**30) if device.type == "cpu" else None,
                # Seeded requests and chunked prefill do not mix on the CPU: rewinding the sampler's generator
                # after a partial prefill needs generator offsets, which CPU generators lack.
                enable_chunked_prefill=False,
                max_num_batched_tokens=max(8192, max_model_len),
                use_tqdm_on_load=quiet.verbose(),
                **lora,
            )
        self.adapters = AdapterVersions(adapters) if adapters is not None else None
        tokenizer = self.llm.get_tokenizer()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSpec) -> TensorDict:
        params = [
            self._params(n, sampling, None if sampling.seed is None else sampling.seed + i * n)
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False, lora_request=self._adapter()
        )
        return self._pack(prompts, outputs, n)

    def stream(
        self, requests: Iterable[GroupRequest], n: int, sampling: SamplingSpec, max_in_flight: int
    ) -> Iterator[tuple[int, TensorDict]]:
        """vLLM's request-level loop (add requests, step, collect the finished ones), as ``LLM.generate`` runs it,
        with new requests added as groups finish."""
        check_room(max_in_flight)
        engine, pending = self.llm.llm_engine, iter(requests)
        in_flight: dict[str, GroupRequest] = {}
        try:
            while True:
                for request in islice(pending, max_in_flight - len(in_flight)):
                    # LLM.generate's own path for one prompt: rendered, asked for its final output only, named by
                    # the LLM's request counter (the name its output carries; vLLM adds a suffix of its own inside)
                    request_id = str(self.llm.request_counter.counter)
                    (internal,) = self.llm._add_completion_requests(
                        prompts=[{"prompt_token_ids": list(request.prompt)}],
                        params=[self._params(n, sampling, request.seed)],
                        use_tqdm=False,
                        lora_request=self._adapter(),
                    )
                    if not internal.startswith(request_id):
                        raise RuntimeError(f"vLLM named request {request_id} {internal!r}: this vLLM is not supported")
                    in_flight[request_id] = request
                if not in_flight:
                    return
                if not engine.has_unfinished_requests():  # never spin on an engine with nothing to do
                    raise RuntimeError(f"vLLM finished requests {sorted(in_flight)} without returning them")
                for output in engine.step():
                    if output.finished and output.request_id in in_flight:
                        request = in_flight.pop(output.request_id)
                        yield request.key, self._pack([request.prompt], [output], n)
        finally:
            if in_flight:  # the caller stopped early: nothing of these groups is wanted
                engine.abort_request(list(in_flight))

    @staticmethod
    def _params(n: int, sampling: SamplingSpec, seed: int | None):
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            logprobs=0,  # the sampled token's own log-prob at every step
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,  # the stop string's tokens were sampled: they stay
            seed=seed,
        )

    def _pack(self, prompts: Sequence[Sequence[int]], outputs, n: int) -> TensorDict:
        responses, logprobs, truncated = [], [], []
        for out in outputs:
            for completion in sorted(out.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                responses.append(ids)
                logprobs.append([step[tok].logprob for step, tok in zip(completion.logprobs, ids, strict=True)])
                truncated.append(completion.finish_reason == "length")  # "stop": an end token or stop string
        return pack_rollouts(prompts, responses, logprobs, truncated, n, self.pad_id)

    def _adapter(self):
        """The newest adapter version's request (None: the base weights, before the first adapter push)."""
        return self.adapters.newest if self.adapters is not None else None

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        # In the engine's dtype: a bf16 engine gets bf16 tensors (half the bytes, and no per-tensor dtype warning).
        weights = [(name, t.detach().to(self.dtype)) for name, t in named_tensors]
        if is_adapter_push(name for name, _ in weights):
            if self.adapters is None:
                raise RuntimeError("an adapter push reached a vLLM engine started without adapters (model.lora.push)")
            # loaded now, not by the first request that names it
            self.llm.llm_engine.add_lora(self.adapters.add(weights, version))
            return
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()

    def shutdown(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            core = getattr(engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            del llm
        if self.adapters is not None:
            self.adapters.close()


@dataclass(frozen=True)
class AdapterSlots:
    """What a vLLM engine that applies pushed adapters is started with: the adapters' ``alpha`` (their config is
    otherwise read off the tensors), the largest rank, and how many versions may be in use at once."""

    alpha: float
    rank: int
    slots: int = 1

    @property
    def max_rank(self) -> int:
        """The least rank vLLM accepts as a maximum that holds ``rank``."""
        from vllm.config.lora import MaxLoRARanks

        return min(r for r in get_args(MaxLoRARanks) if r >= self.rank)


class AdapterVersions:
    """The adapters pushed to one engine: each a peft folder inside a private folder of the engine's own (a
    :class:`~grpo_rl.engines.weight_folder.RunFolder`: mode 0700, in memory where ``/dev/shm`` is, swept by a later
    engine if a killed one left it), named to vLLM by a number that only grows (a version pushed again, as after a
    resume, is a new adapter to vLLM). The folders of the newest ``2 * slots + 1`` pushes are kept: vLLM reads a
    folder again when it evicted the adapter from its cache while a request that names it was still waiting.
    ``parent``: where the private folder goes (default :func:`~grpo_rl.engines.weight_folder.default_parent`; a
    served engine's is one its servers see too)."""

    def __init__(self, spec: AdapterSlots, parent: Path | None = None):
        self.spec = spec
        self._folder = RunFolder(parent or default_parent())
        self.pushes = 0
        self.newest = None
        self.bytes = 0
        self.retired: list[str] = []
        """The names whose folders the last :meth:`add` removed: adapters no request may name any more."""
        self._kept: deque[tuple[str, Path]] = deque()

    def add(self, weights: list[tuple[str, torch.Tensor]], version: int | None):
        """Write ``weights`` as the next adapter; the ``LoRARequest`` that names it."""
        from vllm.lora.request import LoRARequest

        self.pushes += 1
        folder = self._folder.path / f"{self.pushes:08d}"
        self.bytes = write_adapter(folder, dict(weights), self.spec.alpha)
        if self.pushes == 1:
            log.info("weight pushes carry the LoRA adapter alone: %.1f MB a push", self.bytes / 1e6)
        self.newest = LoRARequest(f"policy-{self.pushes}-v{version}", self.pushes, str(folder))
        self._kept.append((self.newest.lora_name, folder))
        self.retired = []
        while len(self._kept) > 2 * self.spec.slots + 1:
            name, old = self._kept.popleft()
            shutil.rmtree(old, ignore_errors=True)
            self.retired.append(name)
        return self.newest

    def close(self) -> None:
        self._folder.close()
