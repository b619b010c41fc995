"""What both workers of ``trl_compare.py`` share: the workload, the reward, and the line protocol.

This file is imported by the TRL worker too, which runs in ``benchmarks/.venv-trl`` without grpo_rl's
dependencies: it uses the standard library only, and loads grpo_rl's GSM8K reward module (plain ``re`` and
``fractions``) straight from its file.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The workload.
WORKLOAD = dict(
    model="embedded:smollm2-135m-instruct",
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=64,
    temperature=1.0,
    kl_coef=0.04,
    lr=1e-6,
    seed=0,
)

# Reward weights, the same on both sides: GSM8K correctness, the '#### N' format, and brevity.
REWARD_WEIGHTS = {"correct": 1.0, "format": 0.5, "brevity": 0.25}
BREVITY_CHARS = 400

MARK = "@@BENCH "


def _gsm8k_module():
    path = ROOT / "grpo_rl" / "envs" / "tasks" / "gsm8k" / "reward.py"
    spec = importlib.util.spec_from_file_location("_gsm8k_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_GSM8K = _gsm8k_module()


def correct(responses, references, **_):
    """1 when the final answer equals the reference (grpo_rl.envs.tasks.gsm8k.reward.correctness_reward)."""
    return _GSM8K.correctness_reward(list(responses), list(references))


def format_(responses, references, **_):
    """1 / 0.5 / 0 for the '#### N' last line (grpo_rl.envs.tasks.gsm8k.reward.format_reward)."""
    return _GSM8K.format_reward(list(responses), list(references), template="hash")


def brevity(responses, references=None, **_):
    """``1 - len/400`` characters, clipped at 0: a graded length component that every group varies in.

    A 135M model rarely answers GSM8K right within 64 tokens, so correctness and format alone leave most groups
    with equal rewards and zero advantages; this term makes every step's gradient non-zero on both sides.
    """
    return [max(0.0, 1.0 - len(r) / BREVITY_CHARS) for r in responses]


def emit(event: str, **fields) -> None:
    """One protocol line on stdout (library logging may share stdout; the orchestrator keeps only these)."""
    sys.stdout.write(MARK + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def wait_for_command() -> str:
    """Block until the orchestrator sends a command line ('step' or 'quit')."""
    line = sys.stdin.readline()
    return line.strip() or "quit"


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
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


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


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a binomial proportion."""
    import math

    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))
