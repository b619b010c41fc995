"""The FLOP accounting behind the benchmarks' bound and floor (``benchmarks/micro/flops.py``): the decoding share of
generation, and a floor that charges only that share at the decoding rate."""

from __future__ import annotations

import pytest

from benchmarks.micro.flops import StepFlops, best_rates, bounds, matmul_rates, step_flops

# SmolLM2-135M's dimensions.
CFG = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
}
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "vocab_size": 100,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def test_decode_is_generation_less_the_prefill_and_grows_with_the_answers():
    one = step_flops(CFG, [[150, 64, 64, 64, 64]])
    two = step_flops(CFG, [[150, 64, 64, 64, 64], [150, 64, 64, 64, 64]])
    assert one.sequences == 4 and two.sequences == 8
    assert two.decode == pytest.approx(2 * one.decode)
    # A one-token answer needs no decoding pass: the generation left is the prefill alone.
    prefill = step_flops(CFG, [[150, 1, 1, 1, 1]])
    assert prefill.decode == 0
    assert one.generation - one.decode == pytest.approx(prefill.generation)
    # Per fed token, decoding costs at least the linear layers and the LM head.
    linear = 30 * (576 * 576 * 2 + 2 * 576 * 192 + 3 * 576 * 1536)
    assert one.decode >= 4 * 63 * 2 * (linear + 576 * 49152)


def test_the_floor_charges_decoding_at_its_own_rate_and_nothing_else():
    f = step_flops(CFG, [[150, 64, 64, 64, 64]] * 4)
    rates = {"fp32": 150e9, "fp32_decode": 50e9, "bf16": 350e9}
    got = bounds(f, rates, engine="fp32", train="fp32")
    bound, floor = got["bound"], got["floor"]
    assert bound["generation_s"] == pytest.approx(f.generation / 150e9)
    assert floor["generation_s"] == pytest.approx((f.generation - f.decode) / 150e9 + f.decode / 50e9)
    assert floor["reference_s"] == bound["reference_s"] and floor["training_s"] == bound["training_s"]
    # Without a decoding rate (a bf16 engine here) the floor is the bound.
    same = bounds(f, rates, engine="bf16", train="fp32")
    assert same["floor"] == pytest.approx(same["bound"])


def test_step_flops_mean_keeps_every_field():
    a, b = StepFlops(1, 2, 3, 4, 5, 6), StepFlops(3, 4, 5, 6, 7, 8)
    assert StepFlops.mean([a, b]) == StepFlops(2, 3, 4, 5, 6, 7)


def test_matmul_rates_measures_a_decoding_step_on_request():
    rates = matmul_rates(TINY, threads=1, tokens=8, repeats=1, decode_rows=4)
    assert rates["decode_rows"] == 4
    for key in ("fp32", "bf16", "fp32_decode", "bf16_decode"):
        assert rates[key] > 0
    assert "fp32_decode" not in matmul_rates(TINY, threads=1, tokens=8, repeats=1)


def test_best_rates_takes_the_better_of_sleeping_and_spinning_threads():
    rates = best_rates(TINY, threads=1, decode_rows=4)
    assert set(rates) == {"threads", "decode_rows", "fp32", "bf16", "fp32_decode", "bf16_decode"}
    assert rates["decode_rows"] == 4 and all(rates[k] > 0 for k in ("fp32", "bf16", "fp32_decode", "bf16_decode"))


def test_rate_tries_keep_each_rates_best_try_and_report_the_spread(monkeypatch):
    from benchmarks.micro import flops

    tries = iter(
        [
            {"threads": 2, "decode_rows": 4, "fp32": 150e9, "bf16": 300e9, "fp32_decode": 50e9, "bf16_decode": 90e9},
            {"threads": 2, "decode_rows": 4, "fp32": 106e9, "bf16": 340e9, "fp32_decode": 55e9, "bf16_decode": 80e9},
        ]
    )
    monkeypatch.setattr(flops, "best_rates", lambda *a, **k: next(tries))
    rates = flops.RateTries(TINY, threads=2, decode_rows=4)
    rates.measure()
    rates.measure()
    best = rates.best()
    assert best == {
        "threads": 2,
        "decode_rows": 4,
        "fp32": 150e9,
        "bf16": 340e9,
        "fp32_decode": 55e9,
        "bf16_decode": 90e9,
    }
    spread = rates.spread()
    assert spread["fp32"]["tries"] == [150e9, 106e9] and spread["fp32"]["worst"] == 106e9
    assert spread["fp32"]["ratio"] == pytest.approx(150 / 106)
    assert "fp32 150 (106-150, 1.42x)" in rates.spread_line() and "over 2 tries" in rates.spread_line()
    other = flops.RateTries(TINY, threads=2, decode_rows=8)
    other.tries = [
        {"threads": 2, "decode_rows": 8, "fp32": 161e9, "bf16": 200e9, "fp32_decode": 70e9, "bf16_decode": 1}
    ]
    pooled = flops.RateTries.pooled([rates, other], ("fp32", "bf16"))  # the 512-row shapes: every try counts
    assert pooled.best() == {"threads": 2, "fp32": 161e9, "bf16": 340e9}
    assert pooled.spread()["fp32"]["tries"] == [150e9, 106e9, 161e9] and set(pooled.spread()) == {"fp32", "bf16"}
