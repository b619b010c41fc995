"""The machine a benchmark ran on, and what its process holds: the CPU line, peak RSS, glibc's counts, threads.

Standard library at import (the TRL worker imports it in ``benchmarks/.venv-trl``); heavier imports stay inside
the functions that need them.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
from pathlib import Path


def cpu_line() -> str:
    """``CPU: <model> (<matmul instruction sets>), N cores; load average a b c``, from
    ``grpo_rl.model.precision.cpu_flags`` (the run's own banner names the CPU the same way)."""
    from grpo_rl.model.precision import cpu_flags

    load = os.getloadavg()
    return f"CPU: {cpu_flags()}, {os.cpu_count()} cores; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


@functools.cache
def announce_machine() -> str:
    """Print :func:`cpu_line` the first time it is called in this process, and return that line: every benchmark
    states the CPU it measured on before it measures (``run_script`` calls it too)."""
    line = cpu_line()
    print(line, flush=True)
    return line


def machine() -> dict:
    """The CPU model, core count and the matmul instruction sets that decide the bf16 rate."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return {"cpu": model, "cores": os.cpu_count(), "isa": isa}


def peak_rss_gib() -> float:
    """This process's peak resident set size (``ru_maxrss``, KiB on Linux) in GiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_gib() -> tuple[float, float]:
    """glibc's view: (bytes handed out and not freed, bytes freed but kept by the allocator), in GiB.

    RSS growing while the first number stays flat is the allocator keeping freed memory, not a leak.
    ``(nan, nan)`` where the C library has no ``mallinfo2`` (glibc < 2.33, musl).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        return float("nan"), float("nan")
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**30, info.fordblks / 2**30


def malloc_trim() -> None:
    """Hand the allocator's free pages back to the kernel (glibc ``malloc_trim(0)``); a no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def set_threads(n: int) -> None:
    import torch

    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
