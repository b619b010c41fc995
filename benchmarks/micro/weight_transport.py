"""CPU weight transport between processes: Ray object store vs safetensors bytes.

    python benchmarks/micro/weight_transport.py                         # tiny model + SmolLM2-135M, 5 repeats
    python benchmarks/micro/weight_transport.py --models tiny --repeats 3 --json /tmp/wt.json

A learner-side process sends a model's full state dict to a receiver actor, which turns it back into
``(name, tensor)`` pairs ready for ``engine.update_weights`` (the engine's own reload is not timed: it is the
same for every transport). Timed: pack (sender), transfer + unpack (receiver), end to end. Variants:

* ``object_store_numpy``: ``ray.put`` of ``{name: tensor.numpy()}``; the receiver's ``ray.get`` maps the
  arrays zero-copy from shared memory (what :mod:`grpo_rl.weights.sync` ships);
* ``object_store_torch``: ``ray.put`` of ``{name: tensor}`` (tensors are pickled, copied on both sides);
* ``safetensors_bytes``: ``safetensors.torch.save`` to bytes, sent as an argument, ``safetensors.torch.load``.

Prints a table and writes JSON. Results of one run are in benchmarks/README.md (Measurements behind library defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS  # noqa: E402
from grpo_rl.weights.sync import unique_tensors  # noqa: E402


def make_state(which: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM, LlamaConfig

    if which == "tiny":  # the test model: hidden 64, 2 layers, SmolLM2's 49k vocabulary
        cfg = LlamaConfig(
            vocab_size=49152,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        )
        model = AutoModelForCausalLM.from_config(cfg)
    else:
        from grpo_rl.model.loading import resolve_model

        model = AutoModelForCausalLM.from_pretrained(resolve_model("embedded:smollm2-135m-instruct"))
    return dict(unique_tensors(model.state_dict().items()))


def pack(variant: str, state: dict[str, torch.Tensor]):
    import ray

    if variant == "object_store_numpy":
        return [ray.put({k: v.detach().contiguous().numpy() for k, v in state.items()})]
    if variant == "object_store_torch":
        return [ray.put({k: v.detach().contiguous() for k, v in state.items()})]
    from safetensors.torch import save

    return save({k: v.detach().contiguous() for k, v in state.items()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="tiny,smollm2-135m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=str(RESULTS / "weight_transport.json"))
    args = parser.parse_args()

    import ray

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=1)
    class Receiver:
        def receive(self, variant: str, payload) -> float:
            t0 = time.perf_counter()
            if variant.startswith("object_store"):
                arrays = ray.get(payload[0])
                named = [(k, torch.as_tensor(v)) for k, v in arrays.items()]
            else:
                from safetensors.torch import load

                named = list(load(payload).items())
            assert named
            return time.perf_counter() - t0

    receiver = Receiver.remote()
    ray.get(receiver.receive.remote("safetensors_bytes", pack("safetensors_bytes", {"w": torch.zeros(1)})))
    rows = []
    variants = ("object_store_numpy", "object_store_torch", "safetensors_bytes")
    try:
        for which in args.models.split(","):
            state = make_state(which)
            mbytes = sum(v.numel() * v.element_size() for v in state.values()) / 2**20
            times = {v: {"pack": [], "receive": [], "total": []} for v in variants}
            for _ in range(args.repeats):  # variants interleaved, so a busy machine slows them alike
                for variant in variants:
                    t0 = time.perf_counter()
                    payload = pack(variant, state)
                    t1 = time.perf_counter()
                    times[variant]["receive"].append(ray.get(receiver.receive.remote(variant, payload)))
                    times[variant]["total"].append(time.perf_counter() - t0)
                    times[variant]["pack"].append(t1 - t0)
                    del payload
            for variant in variants:
                r = {
                    "model": which,
                    "mbytes": round(mbytes, 1),
                    "variant": variant,
                    **{f"{k}_s": statistics.median(v) for k, v in times[variant].items()},
                }
                rows.append(r)
                print(
                    f"{which:14s} {mbytes:8.1f} MiB  {variant:20s} pack {r['pack_s']:.3f}s  "
                    f"receive {r['receive_s']:.3f}s  total {r['total_s']:.3f}s",
                    flush=True,
                )
    finally:
        ray.shutdown()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
