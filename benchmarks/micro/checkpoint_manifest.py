"""What a checkpoint's manifest costs: hashing a weights file against writing it, for the candidate hashes.

    .venv/bin/python benchmarks/micro/checkpoint_manifest.py                  # a 500 MB file, 3 repeats
    .venv/bin/python benchmarks/micro/checkpoint_manifest.py --mb 2000 --repeats 1
    OPENSSL_ia32cap=":~0x20000000" .venv/bin/python benchmarks/micro/checkpoint_manifest.py   # SHA-256 without SHA-NI

The baseline is what a checkpoint does anyway: write the bytes as a safetensors file and fsync them. Then, on the
freshly written file (in the page cache, as it is when the manifest is written): reading it alone, SHA-256 (the
manifest's, grpo_rl/run/manifest.py), BLAKE2b, SHA-1, MD5 and CRC-32 (zlib), and the whole manifest of a folder
holding it (write_manifest, then find_damage with its cache cleared). Then a whole checkpoint of the default run's
model (SmolLM2-135M in fp32 with an AdamW state: 1.6 GB) saved by the Checkpointer with and without its manifest,
the two arms alternated. Each figure is the best of ``--repeats``. The ``OPENSSL_ia32cap`` line hides the CPU's SHA
extensions from OpenSSL, for the cost on a CPU without them. Writes ``benchmarks/results/checkpoint_manifest.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

from benchmarks.common import RESULTS, ROOT  # noqa: E402
from benchmarks.common.machine import machine  # noqa: E402

CHUNK = 8 << 20


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def digest(file: Path, name: str) -> None:
    h = hashlib.new(name)
    with open(file, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    h.hexdigest()


def crc32(file: Path) -> None:
    value = 0
    with open(file, "rb") as f:
        while chunk := f.read(CHUNK):
            value = zlib.crc32(chunk, value)


def read_only(file: Path) -> None:
    with open(file, "rb") as f:
        while f.read(CHUNK):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=500, help="size of the weights file, MB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch
    from safetensors.torch import save_file

    from grpo_rl.run import manifest

    weights = torch.randn(args.mb * 2**20 // 4)  # fp32
    rows = []
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:
        folder = Path(tmp) / "step_00000001"
        (folder / "model").mkdir(parents=True)
        file = folder / "model" / "model.safetensors"

        def write() -> None:
            save_file({"w": weights}, str(file))
            with open(file, "rb") as f:
                os.fsync(f.fileno())

        rows.append(("write + fsync (the baseline)", best_of(args.repeats, write)))
        rows.append(("read only", best_of(args.repeats, lambda: read_only(file))))
        for name in ("sha256", "blake2b", "sha1", "md5"):
            rows.append((name, best_of(args.repeats, lambda n=name: digest(file, n))))
        rows.append(("crc32 (zlib)", best_of(args.repeats, lambda: crc32(file))))
        rows.append(("write_manifest (sha256)", best_of(args.repeats, lambda: manifest.write_manifest(folder))))

        def verify() -> None:
            manifest._CHECKED.clear()
            assert manifest.find_damage(folder) is None

        rows.append(("find_damage, not cached (sha256)", best_of(args.repeats, verify)))
    write_s = rows[0][1]
    print(f"{args.mb} MB file; {machine()}; OPENSSL_ia32cap={os.environ.get('OPENSSL_ia32cap', '(unset)')}")
    print(f"{'':36} {'seconds':>8} {'MB/s':>8} {'of the write':>13}")
    for name, seconds in rows:
        print(f"{name:36} {seconds:8.3f} {args.mb / seconds:8.0f} {seconds / write_s:12.0%}")
    saves = checkpoint_saves(args.repeats)
    print(
        f"checkpoint of SmolLM2-135M with its AdamW state ({saves['gb']:.2f} GB): save without the manifest "
        f"{saves['without']:.2f} s, with it {saves['with']:.2f} s (+{saves['with'] / saves['without'] - 1:.0%})"
    )
    out = RESULTS / "checkpoint_manifest.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "mb": args.mb,
        "machine": machine(),
        "openssl_ia32cap": os.environ.get("OPENSSL_ia32cap"),
        "seconds": dict(rows),
        "checkpoint_save": saves,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


def checkpoint_saves(repeats: int) -> dict:
    """Best save times of a whole checkpoint with and without its manifest, the arms alternated."""
    import torch

    from grpo_rl.model.loading import load_causal_lm, load_tokenizer, resolve_model
    from grpo_rl.run import checkpoint

    path = resolve_model("embedded:smollm2-135m-instruct")
    model, tokenizer = load_causal_lm(path, torch.device("cpu")), load_tokenizer(path)
    adam = {k: [p.detach().clone() for p in model.parameters()] for k in ("exp_avg", "exp_avg_sq")}
    real = checkpoint.write_manifest
    times: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:
        saver = checkpoint.Checkpointer(tmp, keep=1)
        for _ in range(repeats):
            for arm in ("with", "without"):
                checkpoint.write_manifest = real if arm == "with" else (lambda folder: folder)
                started = time.perf_counter()
                saved = saver.save(1, model, tokenizer, {"learner": adam})
                times[arm].append(time.perf_counter() - started)
        gb = sum(f.stat().st_size for f in saved.rglob("*") if f.is_file()) / 1e9
    checkpoint.write_manifest = real
    return {"gb": gb, "with": min(times["with"]), "without": min(times["without"])}


if __name__ == "__main__":
    main()
