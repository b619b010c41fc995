"""Compute precision from the hardware: bf16 only where it is fast on the device at hand.

On CPUs the cost of a bf16 matmul varies by two orders of magnitude between machines of one kind: with AMX or
avx512_bf16 oneDNN runs it several times faster than fp32, while on an AVX2-only CPU it falls back to a path tens
of times slower (rates per CPU in benchmarks/README.md; ``benchmarks/micro/flops.py`` measures them). A default that
assumes either one is wrong on the other, so ``precision: auto`` (the default of the learner, the reference and the
engine) decides from a measurement:

* CUDA: bf16 when ``torch.cuda.is_bf16_supported()``.
* CPU: bf16 when oneDNN reports bf16 support and a short bf16 matmul, timed against the same fp32 matmul on
  this machine, is at least :data:`MIN_SPEEDUP` times faster. The probe takes well under a second and is cached
  per process and on disk (keyed by the CPU model, its flags, the instruction-set caps set in the environment
  such as ``ONEDNN_MAX_CPU_ISA``, and the torch version), so a busy moment on one start does not flip the answer
  of the next; delete ``<cache>/precision_probe.json`` to measure again.

An explicit ``float32`` or ``bfloat16`` always wins. The choice and its reason are logged at start-up.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "float32", "bfloat16")
MIN_SPEEDUP = 1.25
"""bf16 must beat fp32 by this factor on the probe: casts and non-matmul work eat part of a small margin."""


@dataclass(frozen=True)
class BF16Probe:
    """What the hardware says about bf16 matmuls."""

    fast: bool
    reason: str
    fp32_gflops: float | None = None
    bf16_gflops: float | None = None


@dataclass(frozen=True)
class Precision:
    """A role's resolved compute precision."""

    dtype: str
    """``float32`` or ``bfloat16``."""
    reason: str

    @property
    def bf16(self) -> bool:
        return self.dtype == "bfloat16"


def resolve_precision(requested: str, device: torch.device, probe: BF16Probe | None = None) -> Precision:
    """``requested`` (auto | float32 | bfloat16) on ``device`` -> the precision to use and why; ``probe`` stands
    in for :func:`probe_bf16` (tests)."""
    if requested != "auto":
        return Precision(requested, "set explicitly")
    probe = probe if probe is not None else probe_bf16(device)
    return Precision("bfloat16" if probe.fast else "float32", probe.reason)


def probe_bf16(device: torch.device) -> BF16Probe:
    """Whether bf16 matmuls are fast on ``device`` (cached)."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return BF16Probe(ok, f"{torch.cuda.get_device_name(device)} {'supports' if ok else 'lacks'} bf16")
    if device.type != "cpu":
        return BF16Probe(False, f"no bf16 probe for {device.type}: float32 is the safe choice")
    return _probe_cpu()


@functools.cache
def _probe_cpu() -> BF16Probe:
    path = _cache_file()
    key = _cpu_key()
    cached = _read_cache(path, key)
    if cached is not None:
        return cached
    result = measure_cpu_bf16()
    _write_cache(path, key, result)
    return result


def measure_cpu_bf16(size: int = 512, repeats: int = 5) -> BF16Probe:
    """Time ``[size x size] @ [size x size]`` in fp32 and bf16 (interleaved, best of ``repeats``)."""
    if not _onednn_bf16():
        return BF16Probe(
            False,
            "this CPU has no bf16 matmul instructions (no avx512_bf16 or AMX): bf16 would run "
            "tens of times slower than float32",
        )
    best = _best_matmul_seconds(size, repeats)
    flop = 2 * size**3 / 1e9
    fp32, bf16 = flop / best["float32"], flop / best["bfloat16"]
    fast = bf16 >= MIN_SPEEDUP * fp32
    verdict = "faster" if fast else f"not {MIN_SPEEDUP}x faster"
    return BF16Probe(
        fast,
        f"measured bf16 matmul {bf16:.0f} GFLOP/s vs float32 {fp32:.0f}: {verdict}",
        fp32_gflops=round(fp32, 1),
        bf16_gflops=round(bf16, 1),
    )


def _onednn_bf16() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _best_matmul_seconds(size: int, repeats: int) -> dict[str, float]:
    a32, b32 = torch.randn(size, size), torch.randn(size, size)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    best = {"float32": float("inf"), "bfloat16": float("inf")}
    for _ in range(repeats + 1):  # the first round warms the kernels up
        for name, (a, b) in (("float32", (a32, b32)), ("bfloat16", (a16, b16))):
            t0 = time.perf_counter()
            a @ b
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def cpu_flags() -> str:
    """The CPU model and its matmul-relevant instruction sets, for logs and benchmark tables."""
    model, flags = _cpuinfo()
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
    present = [f for f in wanted if f in flags]
    caps = [f"{name}={os.environ[name]}" for name in _ISA_ENV if os.environ.get(name)]
    capped = f"; capped by {' '.join(caps)}" if caps else ""
    return f"{model or 'unknown CPU'} ({' '.join(present) or 'no AVX2'}{capped})"


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "", frozenset()
    model, flags = "", frozenset()
    for line in text.splitlines():
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        elif line.startswith(("flags", "Features")) and not flags:
            flags = frozenset(line.split(":", 1)[1].split())
    return model, flags


# Environment variables that cap the instruction sets oneDNN and MKL use: a capped process is another CPU kind.
_ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")


def _cpu_key() -> str:
    model, flags = _cpuinfo()
    caps = ",".join(f"{name}={os.environ.get(name, '')}" for name in _ISA_ENV)
    text = f"{model}|{' '.join(sorted(flags))}|{caps}|{torch.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_file() -> Path:
    root = os.environ.get("GRPO_CACHE_DIR") or Path.home() / ".cache" / "grpo_rl"
    return Path(root) / "precision_probe.json"


def _read_cache(path: Path, key: str) -> BF16Probe | None:
    try:
        entry = json.loads(path.read_text()).get(key)
        return BF16Probe(**entry) if entry else None
    except (OSError, ValueError, TypeError):
        return None


def _write_cache(path: Path, key: str, probe: BF16Probe) -> None:
    try:
        entries = json.loads(path.read_text()) if path.exists() else {}
        entries[key] = asdict(probe)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(path)
    except (OSError, ValueError):  # a read-only home is no reason to fail a run: the probe is cheap
        log.debug("could not cache the bf16 probe in %s", path)
