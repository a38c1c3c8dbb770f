"""kit.metrics: every formula on hand-computed numbers (each value below is worked out in the comment)."""

import math

import numpy as np
import pytest

from kit import metrics as M


def test_percentiles_linear_with_n_and_missing_values_dropped():
    p = M.percentiles([4.0, 1.0, None, 3.0, float("nan"), 2.0])
    # sorted 1,2,3,4: linear p50 = 2.5, p90 = 3 + 0.7 * 1 = 3.7, p99 = 3 + 0.97 = 3.97
    assert p["n"] == 4 and p["p50"] == 2.5 and p["p90"] == pytest.approx(3.7) and p["p99"] == pytest.approx(3.97)
    assert p["p50"] == float(np.percentile([1, 2, 3, 4], 50, method="linear"))
    empty = M.percentiles([])
    assert empty["n"] == 0 and math.isnan(empty["p50"])


def test_latency_summary():
    lat = M.Latency.from_values([3.0, 1.0, 2.0])
    assert (lat.p50, lat.min, lat.mean, lat.n) == (2.0, 1.0, 2.0, 3) and "n=3" in str(lat)
    assert M.Latency.from_values([]).n == 0


def test_in_process_throughputs():
    assert M.decode_tok_s(16, 20.0) == 800.0  # 16 sequences / 0.020 s
    assert M.tok_s_per_stream(20.0) == 50.0  # 1000 / 20 ms
    assert M.prefill_tok_s(4, 512, 100.0) == 20480.0  # 4 × 512 / 0.1 s
    assert M.achieved_gb_s(16e9, 4.0) == 4.0  # 16 GB in 4 s
    assert all(math.isnan(x) for x in (M.decode_tok_s(1, 0), M.tok_s_per_stream(0), M.achieved_gb_s(1, 0)))


def test_request_timings_token_normalised_itl_and_tpot():
    # sent at t0 = 10.0 s; chunks at +0.1 s (1 token), +0.2 s (2 tokens), +0.5 s (1 token); 4 output tokens
    r = M.request_timings([10.1, 10.2, 10.5], [1, 2, 1], output_tokens=4, t0_s=10.0)
    assert r.ttft_ms == pytest.approx(100.0) and r.e2el_ms == pytest.approx(500.0)
    assert r.tpot_ms == pytest.approx((500.0 - 100.0) / 3)
    assert r.chunk_gaps_ms == pytest.approx([100.0, 300.0]) and r.itl_ms == pytest.approx([50.0, 50.0, 300.0])
    one = M.request_timings([1.0], [1], output_tokens=1)
    assert one.tpot_ms is None and one.itl_ms == []  # never a division by zero
    with pytest.raises(ValueError, match="3 entries but chunk_tokens has 2"):
        M.request_timings([1, 2, 3], [1, 1], 3)


def test_request_timings_first_chunk_extra_tokens_are_zero_ms_entries_case_e5_e7():
    # E5: 3 tokens at 0.5 s, then 1 token at 0.6, 0.7, 0.8, 0.9 s: TPOT (900 - 500) / 6 = 66.7 ms
    r = M.request_timings([0.5, 0.6, 0.7, 0.8, 0.9], [3, 1, 1, 1, 1], output_tokens=7)
    assert r.tpot_ms == pytest.approx(400.0 / 6) and r.chunk_gaps_ms == pytest.approx([100.0] * 4)
    assert r.itl_ms == pytest.approx([0.0, 0.0, 100.0, 100.0, 100.0, 100.0])  # n = 6, mean 66.7 = TPOT
    assert np.mean(r.itl_ms) == pytest.approx(r.tpot_ms)
    # E7: tokens per chunk unknown: the ITL is unknown, the chunk gaps keep their own name
    u = M.request_timings([0.2 + 0.04 * k for k in range(10)], None, output_tokens=40)
    assert u.itl_ms is None and u.chunk_gaps_ms == pytest.approx([40.0] * 9) and u.tpot_ms == pytest.approx(360 / 39)


def test_slo_goodput_and_served_throughputs():
    assert M.meets_slo(100, 20, 500, 10, slo_ttft_ms=100, slo_tpot_ms=20)  # inclusive
    assert not M.meets_slo(101, 20, 500, 10, slo_ttft_ms=100)
    assert M.meets_slo(50, None, 60, 1, slo_tpot_ms=5)  # one output token passes the TPOT SLO
    assert M.goodput_rps(6, 3.0) == 2.0
    t = M.throughputs(completed=10, input_tokens=1000, output_tokens=400, duration_s=2.0)
    assert t == {"request_throughput": 5.0, "output_tok_s": 200.0, "total_tok_s": 700.0}


def test_cost_formulas():
    # 8 GPUs at $2.50/GPU-hour serving 952 tok/s: $20/h / (952 × 3600 tok/h) × 1e6 = $5.836 per million tokens
    assert M.usd_per_mtok(952, 2.50, 8) == pytest.approx(5.8357, rel=1e-4)
    assert M.tok_per_usd(952, 2.50, 8) == pytest.approx(952 * 3600 / 20)
    assert M.tok_s_per_gpu(952, 8) == 119.0
    assert math.isnan(M.usd_per_mtok(0, 2.5)) and math.isnan(M.tok_per_usd(100, 0))


def test_collective_bus_bandwidth_nccl_tests_convention():
    assert M.busbw_factor("all_reduce", 8) == 2 * 7 / 8 and M.busbw_factor("all_gather", 4) == 0.75
    alg, bus = M.bus_bandwidth_gb_s("all_reduce", 1e9, 0.01, 8)
    assert alg == pytest.approx(100.0) and bus == pytest.approx(175.0)
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        M.busbw_factor("gather", 8)
