"""Precision from the hardware: the choice logic with the probe's answer forced both ways, and its cache."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.errors import ConfigError
from grpo_rl.model import precision
from grpo_rl.model.precision import BF16Probe, Precision, measure_cpu_bf16, resolve_precision
from grpo_rl.placement.context import resolve_run_precision
from grpo_rl.placement.devices import DeviceAllocation
from grpo_rl.run.preflight import validate

CPU = torch.device("cpu")
FAST = BF16Probe(True, "measured bf16 matmul 900 GFLOP/s vs float32 150: faster")
SLOW = BF16Probe(False, "this CPU has no bf16 matmul instructions")


@pytest.mark.parametrize("probe, want", [(FAST, "bfloat16"), (SLOW, "float32")])
def test_auto_follows_the_probe(probe, want):
    chosen = resolve_precision("auto", CPU, probe=probe)
    assert chosen == Precision(want, probe.reason)
    assert chosen.bf16 == (want == "bfloat16")


@pytest.mark.parametrize("requested", ["float32", "bfloat16"])
@pytest.mark.parametrize("probe", [FAST, SLOW])
def test_an_explicit_precision_wins_over_the_probe(requested, probe):
    assert resolve_precision(requested, CPU, probe=probe) == Precision(requested, "set explicitly")


def test_no_bf16_instructions_means_float32_without_timing(monkeypatch):
    monkeypatch.setattr(precision, "_onednn_bf16", lambda: False)
    monkeypatch.setattr(precision, "_best_matmul_seconds", lambda *a: pytest.fail("timed a matmul"))
    probe = measure_cpu_bf16()
    assert not probe.fast and "no bf16 matmul instructions" in probe.reason


@pytest.mark.parametrize(
    "fp32_s, bf16_s, fast", [(1.0, 0.25, True), (1.0, 0.79, True), (1.0, 0.9, False), (1.0, 50.0, False)]
)
def test_measured_bf16_must_beat_fp32_by_the_margin(monkeypatch, fp32_s, bf16_s, fast):
    monkeypatch.setattr(precision, "_onednn_bf16", lambda: True)
    monkeypatch.setattr(precision, "_best_matmul_seconds", lambda *a: {"float32": fp32_s, "bfloat16": bf16_s})
    probe = measure_cpu_bf16(size=4000)  # 128 GFLOP: 128 GFLOP/s at 1 s
    assert probe.fast is fast
    assert probe.bf16_gflops / probe.fp32_gflops == pytest.approx(fp32_s / bf16_s, rel=5e-2)  # rates rounded to 0.1
    assert ("faster" if fast else "not 1.25x faster") in probe.reason


def test_the_probe_is_cached_on_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path))
    calls = []

    def measure():
        calls.append(1)
        return FAST

    monkeypatch.setattr(precision, "measure_cpu_bf16", measure)
    precision._probe_cpu.cache_clear()
    try:
        assert precision._probe_cpu() == FAST
        precision._probe_cpu.cache_clear()  # a new process: only the file remains
        assert precision._probe_cpu() == FAST
    finally:
        precision._probe_cpu.cache_clear()
    assert len(calls) == 1
    assert (tmp_path / "precision_probe.json").is_file()


def test_each_role_resolves_its_own_setting(monkeypatch):
    monkeypatch.setattr(precision, "probe_bf16", lambda device: SLOW)
    cfg = OmegaConf.structured(GRPOConfig)
    cfg.ref_model.precision = "bfloat16"
    devices = DeviceAllocation(train=(CPU,), ref=(CPU,), inference=(CPU,))
    chosen = resolve_run_precision(cfg, devices)
    assert (chosen.train.dtype, chosen.ref.dtype, chosen.inference.dtype) == ("float32", "bfloat16", "float32")
    assert "ref bfloat16 (set explicitly)" in chosen.describe()
    assert "no bf16 matmul instructions" in chosen.describe()


def test_an_unknown_precision_is_a_config_error():
    cfg = OmegaConf.structured(GRPOConfig)
    cfg.inference_model.precision = "fp16"
    with pytest.raises(ConfigError, match="inference_model.precision='fp16'"):
        validate(cfg)


def test_an_instruction_set_cap_is_another_cpu_kind(monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 makes this process an AVX2-only CPU: it must not reuse the uncapped answer."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    uncapped = precision._cpu_key()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert precision._cpu_key() != uncapped


def test_cpu_flags_name_a_cap(monkeypatch):
    for name in precision._ISA_ENV:  # a suite run under a cap of its own must not change the expected line
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    assert "capped by MKL_ENABLE_INSTRUCTIONS=AVX2)" in precision.cpu_flags()
