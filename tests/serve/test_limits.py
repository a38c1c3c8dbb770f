"""Every served-load setting at and past its limits (case E4 and its kind): burstiness = inf gives evenly spaced
arrivals, every other NaN, infinite, negative, zero, fractional or too-large value is a one-line error naming the
setting, and the arrival loop can never receive a non-finite gap."""

import math

import numpy as np
import pytest
from sse_server import dead_url

from kit.errors import UserError
from kit.serve import schedule
from kit.serve.load import LoadConfig
from kit.serve.loop import run_coro, run_schedule
from kit.serve.schedule import Arrivals
from kit.serve.workload import RequestInput, arrival_gaps_s

NAN, INF = float("nan"), float("inf")


def test_e4_infinite_burstiness_gives_gaps_of_exactly_one_over_the_rate():
    assert arrival_gaps_s(4, 4.0, INF).tolist() == [0.25] * 4
    assert arrival_gaps_s(3, INF, INF).tolist() == [0.0] * 3  # all at once, whatever the burstiness
    g = arrival_gaps_s(20000, 4.0, 1e6, seed=1)  # the limit approached: variance 1/(r² b) -> 0
    assert np.isfinite(g).all() and g.mean() == pytest.approx(0.25, rel=1e-3) and g.std() < 1e-3


@pytest.mark.parametrize("bad", [0, -1, -INF, NAN])
def test_e4_burstiness_and_rate_outside_their_range_are_named(bad):
    with pytest.raises(UserError, match="burstiness"):
        LoadConfig(url="http://x", burstiness=bad).validate()
    with pytest.raises(UserError, match="burstiness"):
        arrival_gaps_s(3, 4.0, bad)
    with pytest.raises(UserError, match="request_rate"):
        LoadConfig(url="http://x", request_rate=bad).validate()
    with pytest.raises(UserError, match="request_rate"):
        arrival_gaps_s(3, bad, 1.0)


@pytest.mark.slow
def test_e4_paced_run_at_infinite_burstiness_spreads_the_requests(scripted):
    cfg = LoadConfig(
        url=scripted.url,
        model="e2a",
        request_rate=4.0,
        burstiness=INF,
        num_requests=4,
        warmup_requests=0,
        max_concurrency=4,
    )
    recs, _ = run_coro(run_schedule(cfg, Arrivals.from_config(cfg, [RequestInput("p", 1, 1)])))
    sent = sorted(r["sent_s"] for r in recs)
    assert all(r["ok"] for r in recs)
    assert sent[-1] - sent[0] == pytest.approx(0.75, abs=0.1)  # never all within a few ms
    # sends are due on an absolute clock (0.25 s apart): one sent late on a busy machine shortens the next gap,
    # so bound the gap well below 0.25 s and far above a burst's few ms
    assert min(b - a for a, b in zip(sent, sent[1:])) > 0.1


def test_the_arrival_loop_refuses_a_non_finite_gap(monkeypatch):
    monkeypatch.setattr(schedule, "arrival_gaps_s", lambda n, *a: np.array([0.1, NAN, 0.1])[:n])
    cfg = LoadConfig(url=dead_url(), model="m", num_requests=3, warmup_requests=0, request_rate=10.0)
    with pytest.raises(AssertionError, match="arrival gap nan"):
        run_coro(run_schedule(cfg, Arrivals.from_config(cfg, [RequestInput("p", 1, 1)])))


BAD = [
    ("max_concurrency", 0),
    ("max_concurrency", 1.5),
    ("max_concurrency", True),
    ("max_concurrency", 10**6),
    ("seed", -1),
    ("seed", 0.5),
    ("num_requests", 0),
    ("num_requests", NAN),
    ("duration_s", 0),
    ("duration_s", INF),
    ("duration_s", NAN),
    ("warmup_requests", -1),
    ("isl", 0),
    ("isl", 2.5),
    ("osl", 0),
    ("osl", INF),
    ("isl_range", 1.0),
    ("isl_range", NAN),
    ("osl_range", -0.1),
    ("timeout_s", 0),
    ("timeout_s", INF),
    ("stall_timeout_s", NAN),
    ("first_byte_timeout_s", -1),
    ("models_timeout_s", 0),
    ("slo_ttft_ms", -1),
    ("slo_tpot_ms", NAN),
    ("slo_e2el_ms", INF),
    ("temperature", -0.5),
    ("temperature", NAN),
    ("max_event_bytes", 10),
    ("max_event_bytes", 2**40),
    ("ignore_eos", "yes"),
    ("model", ""),
    ("url", "ftp://x"),
    ("url", "http://"),
    ("url", "http://[::1"),
]


@pytest.mark.parametrize("name, value", BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_every_field_outside_its_range_is_a_user_error_naming_it(name, value):
    with pytest.raises(UserError) as ei:
        LoadConfig(**{"url": "http://127.0.0.1:8000", name: value}).validate()
    assert name in str(ei.value) and "\n" not in str(ei.value)


def test_limits_that_are_allowed():
    ok = LoadConfig(
        url="https://h:1/v1?x=1", request_rate=INF, burstiness=INF, max_concurrency=None, duration_s=5.0
    ).validate()
    assert ok.num_requests == 64 and math.isinf(ok.burstiness)
    LoadConfig(url="http://h", num_requests=None, duration_s=1.0, slo_ttft_ms=None, isl_range=0.99).validate()


def test_isl_too_large_to_build_is_one_line_before_any_prompt():
    with pytest.raises(UserError, match=r"isl=2000000: 66 distinct prompts .* prompt tokens to build"):
        LoadConfig(url="http://h", isl=2_000_000).validate()
    LoadConfig(url="http://h", isl=200_000, num_requests=20, warmup_requests=0).validate()  # 4M tokens: fine
