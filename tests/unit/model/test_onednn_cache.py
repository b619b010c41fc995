"""Importing grpo_rl caps oneDNN's kernel caches, so that bf16 matmuls over ever new token counts stop growing the
process (each cached kernel holds about half a MiB that the caches' default 1024 entries never give back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import grpo_rl

CAPS = tuple(grpo_rl.ONEDNN_DEFAULTS)

# A bf16 linear layer's forward and backward over 300 token counts, none seen twice; prints how much memory glibc
# handed out over the second 150 (when 64 entries are long full) and the cache settings the process ran with.
PROBE = """
import json, os, sys
sys.path.insert(0, %r)
import grpo_rl, torch
from benchmarks.common.machine import malloc_gib
def in_use():
    return malloc_gib()[0] * 1024
torch.set_num_threads(1)
w = torch.randn(1536, 576, dtype=torch.bfloat16, requires_grad=True)
marks = []
for n in range(300 if sys.argv[1] == "matmuls" else 0):  # the env alone: no bf16 matmul (50x fp32 on AVX2)
    if n == 150:
        marks.append(in_use())
    x = torch.randn(100 + n, 576, dtype=torch.bfloat16, requires_grad=True)
    torch.nn.functional.linear(x, w).sum().backward()
    w.grad = None
print(json.dumps({"grown_mib": in_use() - marks[0] if marks else None, "env": {k: os.environ.get(k) for k in %r}}))
""" % (str(Path(__file__).resolve().parents[3]), CAPS)  # noqa: UP031 - %-format: the program's own braces stay single


def probe(matmuls: bool = True, **env_given: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CAPS}
    env.update(env_given)
    argv = [sys.executable, "-c", PROBE, "matmuls" if matmuls else "env"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_import_sets_the_caps_and_keeps_a_users_value():
    assert probe(matmuls=False)["env"] == grpo_rl.ONEDNN_DEFAULTS
    assert probe(matmuls=False, LRU_CACHE_CAPACITY="7")["env"]["LRU_CACHE_CAPACITY"] == "7"


@pytest.mark.skipif(
    sys.platform != "linux"
    or not torch.backends.mkldnn.is_available()
    or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="oneDNN runs bf16 matmuls only on Linux CPUs with bf16 support (glibc's mallinfo2)",
)
def test_the_caps_stop_bf16_matmuls_over_new_token_counts_from_growing_the_process():
    capped = probe()["grown_mib"]
    uncapped = probe(**{k: "1024" for k in CAPS})["grown_mib"]
    print(f"grown over the last 150 token counts: {capped:.1f} MiB capped, {uncapped:.1f} MiB at 1024 entries")
    # 450 new kernels at 1024 entries (about half a MiB each on an avx512_bf16 CPU: 255 MiB); none kept at 64
    assert uncapped > 20, f"oneDNN's default caches grew {uncapped:.1f} MiB: the probe no longer fills them"
    assert capped < uncapped / 5, (
        f"{capped:.1f} MiB grown with the caps of {grpo_rl.ONEDNN_DEFAULTS}, {uncapped:.1f} MiB without"
    )
