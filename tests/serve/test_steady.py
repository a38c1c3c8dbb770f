"""kit.serve.steady: the steady-state window (requests that ran while the in-flight count was at the target),
exact on hand-made records, and warm-up handing over to measured requests without a drain, against the
simulated server."""

import math

import pytest

from kit.serve.aggregate import aggregate
from kit.serve.load import LoadConfig
from kit.serve.loop import run_coro, run_schedule
from kit.serve.schedule import Arrivals, Steady
from kit.serve.simserver import SimModel, SimServer
from kit.serve.steady import inflight_steps, measured_concurrency, steady_columns, steady_window
from kit.serve.workload import fresh_workload


def rec(i, sent, end, warm=False, ttft=10.0):
    return {
        "request_id": i,
        "warmup": warm,
        "ok": True,
        "sent_s": sent,
        "end_s": end,
        "ttft_ms": ttft,
        "tpot_ms": 5.0,
        "e2el_ms": (end - sent) * 1000,
        "itl_ms": [5.0, 5.0],
        "chunk_times_ms": [(end - sent) * 1000 * k / 3 for k in (1, 2, 3)],
        "output_tokens": 3,
    }


# concurrency 2: a ramp (0 starts alone until 0.1), steady from 0.1 to 0.9, a drain after 0.9
RECORDS = [
    rec(0, 0.0, 0.5, warm=True),
    rec(1, 0.1, 0.6),
    rec(2, 0.5, 0.9),
    rec(3, 0.6, 1.0, ttft=99.0),
    rec(4, 0.9, 1.4, ttft=99.0),
]


def test_window_and_figures_on_known_records():
    t, n = inflight_steps(RECORDS)
    assert max(n) == 2 and n[-1] == 0
    assert steady_window(RECORDS, 2) == (0.1, 1.0)
    col = steady_columns(RECORDS, Steady(target=2))
    # inside [0.1, 1.0]: requests 1, 2, 3 (0 is warm-up, 4 ends after the window)
    assert col["x_steady_n"] == 3 and col["x_steady_ttft_n"] == 3 and col["x_steady_target"] == 2
    assert col["x_steady_window_s"] == pytest.approx(0.9) and col["x_steady_ttft_ms_p50"] == 10.0
    assert col["x_steady_itl_n"] == 6 and col["x_steady_request_throughput"] == pytest.approx(3 / 0.9)
    # tokens whose chunks arrived in [0.1, 1.0]: 3 each of requests 0 (warm-up ones occupy the server too), 1, 2
    # and 3; none of request 4 (its first chunk comes at 0.9 + 0.5/3)
    assert col["x_steady_output_tok_s"] == pytest.approx(12 / 0.9)
    # open loop: from the first measured send to the last send
    assert steady_window(RECORDS, None) == (0.1, 0.9)
    col = steady_columns(RECORDS, Steady())
    assert col["x_steady_target"] is None and col["x_steady_n"] == 2  # requests 1 and 2 ran inside [0.1, 0.9]


def test_no_window_says_why():
    col = steady_columns(RECORDS, Steady(target=8))
    assert col["x_steady_note"] == "in-flight count never reached the target 8" and "x_steady_n" not in col
    col = steady_columns(RECORDS, Steady(note="a ramp has no steady state"))
    assert col["x_steady_note"] == "a ramp has no steady state" and "x_steady_n" not in col


def test_sessions_window_counts_conversations_not_requests():
    """Two conversations of two turns with think time between: never two requests in flight at once, but both
    conversations are in progress from 0.21 (the second starts) to 0.5 (the first ends)."""
    recs = [
        {**rec(0, 0.0, 0.2), "session_id": 0},
        {**rec(1, 0.3, 0.5), "session_id": 0},
        {**rec(2, 0.21, 0.29), "session_id": 1},
        {**rec(3, 0.55, 0.9), "session_id": 1},
    ]
    assert steady_window(recs, 2) is None
    assert steady_window(recs, 2, unit="session_id") == (0.21, 0.5)
    col = steady_columns(recs, Steady(target=2, unit="session_id"))
    assert col["x_steady_n"] == 2  # requests 1 and 2 ran inside [0.21, 0.5]
    col = steady_columns(recs[:1], Steady(target=2, unit="session_id"))
    assert col["x_steady_note"] == "conversations in progress never reached the target 2"


def test_measured_concurrency_is_time_weighted():
    """0.1-0.5: 2 in flight (request 0 is warm-up but occupies a slot), 0.5-0.6: 2, 0.6-0.9: 2, 0.9-1.0: 2,
    1.0-1.4: 1 over the measured span 0.1-1.4."""
    m = measured_concurrency(RECORDS)
    t, n = inflight_steps(RECORDS)
    expect = (
        sum(
            int(n[i]) * (min(t[i + 1], 1.4) - max(t[i], 0.1))
            for i in range(len(t) - 1)
            if t[i + 1] > 0.1 and t[i] < 1.4
        )
        / 1.3
    )
    assert m["x_inflight_mean"] == pytest.approx(expect) and m["x_inflight_max"] == 2
    assert measured_concurrency([]) == {"x_inflight_mean": None, "x_inflight_max": None}


@pytest.mark.slow
def test_warmup_hands_over_without_draining():
    with SimServer(SimModel(ttft_base_ms=5, tpot_base_ms=3)) as sim:
        cfg = LoadConfig(url=sim.url, model="sim", num_requests=12, warmup_requests=2, isl=8, osl=6, max_concurrency=3)
        records, info = run_coro(run_schedule(cfg, Arrivals.from_config(cfg, fresh_workload(cfg, 0))))
    warm = [r for r in records if r["warmup"]]
    meas = [r for r in records if not r["warmup"]]
    assert len(warm) == 2 and len(meas) == 12 and all(r["ok"] for r in records)
    # the first measured request starts before the warm-up ones have all finished: no drain in between
    assert min(r["sent_s"] for r in meas) < max(r["end_s"] for r in warm)
    assert info["duration_s"] == pytest.approx(max(r["end_s"] for r in meas) - min(r["sent_s"] for r in meas))
    row = aggregate(records, cfg, info) | steady_columns(records, Steady(target=3))
    assert row["completed"] == 12 and row["x_ttft_n"] == 12
    assert 0 < row["x_steady_n"] < 12 and row["x_steady_ttft_n"] == row["x_steady_n"]
    # the server paces 3 ms per token; a first chunk stamped late on a busy machine shortens a request's TPOT a little
    assert row["x_steady_tpot_ms_p50"] >= 2.9 and not math.isnan(row["x_steady_output_tok_s"])
