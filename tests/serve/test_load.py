"""kit.serve.load (with kit.serve.workload, kit.serve.loop and kit.serve.selfcheck): the config and its defaults,
workloads, arrivals, aggregation (case E3), and the request loop's closed and open loops against the scripted SSE
server."""

import asyncio
import math
import time

import pytest
from sse_server import chars, dead_url

from kit.serve.aggregate import aggregate
from kit.serve.load import LoadConfig
from kit.serve.loop import not_sent, run_coro, run_schedule
from kit.serve.schedule import Arrivals
from kit.serve.selfcheck import LoopProbe
from kit.serve.workload import (
    WORKLOAD_PRESETS,
    PromptSpec,
    RequestInput,
    arrival_gaps_s,
    build_workload,
    fresh_workload,
)


def run(cfg, workload, tokenizer=None):
    """The closed or open loop of ``cfg`` over ``workload`` through the one request loop."""
    return run_coro(run_schedule(cfg, Arrivals.from_config(cfg, workload), tokenizer))


def late_ok(measured: float, scripted: float, late: float) -> bool:
    """A time since the request was sent that the server scripted with sleeps (TTFT, E2E): on a busy machine it
    can only come out late (by up to ``late``), never early by more than timer resolution (2 %)."""
    return 0.98 * scripted <= measured <= scripted + late


# ---------------------------------------------------------------- config
def test_defaults_are_the_real_server_ones():
    d = LoadConfig()
    assert (d.isl, d.osl) == WORKLOAD_PRESETS["seed"] == (1024, 400)
    assert d.num_requests == 64 and d.warmup_requests == 2 and d.timeout_s == 600.0
    assert d.request_rate == math.inf and d.max_concurrency == 1 and d.extra_body == {}


def test_config_validation_names_bad_values():
    with pytest.raises(ValueError, match="endpoint='embed'"):
        LoadConfig(url="http://x", endpoint="embed").validate()
    with pytest.raises(ValueError, match="max_concurrency=0"):
        LoadConfig(url="http://x", max_concurrency=0).validate()
    with pytest.raises(ValueError, match="request_rate=0"):
        LoadConfig(url="http://x", request_rate=0).validate()
    with pytest.raises(ValueError, match="url="):
        LoadConfig(url="localhost:8000").validate()
    with pytest.raises(ValueError, match="url=''"):
        LoadConfig().validate()
    with pytest.raises(ValueError, match="num_requests or duration_s"):
        LoadConfig(url="http://x", num_requests=None).validate()
    assert LoadConfig(url="http://h:1/v1/").base_url == "http://h:1"


# ---------------------------------------------------------------- E3, aggregation
def test_e3_goodput():
    def rec(ttft, tpot, n_out):
        e2el = ttft + (tpot or 0) * (n_out - 1)
        return {
            "ok": True,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2el_ms": e2el,
            "output_tokens": n_out,
            "input_tokens": 4,
            "itl_ms": [],
            "chunk_gaps_ms": [],
            "n_chunks": n_out,
            "client_queue_ms": 0.0,
        }

    recs = [rec(400, 90, 10), rec(600, 50, 10), rec(300, 100, 10), rec(200, None, 1)]
    cfg = LoadConfig(url="http://x", slo_ttft_ms=500, slo_tpot_ms=100)
    row = aggregate(recs, cfg, {"duration_s": 2.0})
    assert row["x_good_requests"] == 3
    assert row["goodput_rps"] == pytest.approx(1.5)
    assert row["request_throughput"] == pytest.approx(2.0)
    # no SLO given -> goodput missing, not equal to throughput
    assert aggregate(recs, LoadConfig(url="http://x"), {"duration_s": 2.0})["goodput_rps"] is None


def test_not_sent_counts_every_planned_request():
    cfg = LoadConfig(url="http://x", num_requests=3, warmup_requests=2, osl=5)
    recs, info = not_sent(cfg, Arrivals.from_config(cfg, [RequestInput("p", 1, 7)]), "no model")
    assert len(recs) == 5 and sum(r["warmup"] for r in recs) == 2 and {r["max_tokens"] for r in recs} == {7}
    assert info["setup_error"] == "no model" and info["x_client_check"] == "not applied: no request was sent"
    row = aggregate(recs, cfg, info)
    assert row["failed"] == 3 and row["completed"] == 0 and row["status"] == "error"


# ---------------------------------------------------------------- arrivals, workloads
def test_arrivals_gamma_poisson_and_inf():
    assert (arrival_gaps_s(5, math.inf) == 0).all()
    g = arrival_gaps_s(20000, 10.0, 1.0, seed=1)
    assert g.mean() == pytest.approx(0.1, rel=0.03)
    assert g.std() == pytest.approx(0.1, rel=0.05)  # exponential: std = mean
    bursty = arrival_gaps_s(20000, 10.0, 0.25, seed=1)
    assert bursty.mean() == pytest.approx(0.1, rel=0.05) and bursty.std() > 1.8 * g.std()
    assert (arrival_gaps_s(10, 5.0, seed=3) == arrival_gaps_s(10, 5.0, seed=3)).all()
    with pytest.raises(ValueError):
        arrival_gaps_s(3, 1.0, burstiness=0)


def test_workload_presets_and_token_ids():
    assert WORKLOAD_PRESETS["seed"] == (1024, 400) and WORKLOAD_PRESETS["8k/1k"] == (8192, 1024)
    w = build_workload(6, PromptSpec(50, 20, osl_range=0.5), seed=1, as_token_ids=True)
    assert all(len(r.prompt) == 50 and r.input_tokens == 50 for r in w)
    assert all(10 <= r.max_tokens <= 30 for r in w) and len({r.max_tokens for r in w}) > 1
    words = build_workload(2, PromptSpec(7, 3))
    assert len(words[0].prompt.split()) == 7 and words[0].input_tokens is None
    with pytest.raises(ValueError, match="isl_range"):
        build_workload(2, PromptSpec(7, 3, isl_range=1.5))
    with pytest.raises(ValueError, match="n=0"):
        build_workload(0, PromptSpec(7, 3))
    dw = fresh_workload(LoadConfig(url="http://x", num_requests=3, warmup_requests=1, isl=5, osl=2), 0)
    assert len(dw) == 4 and all(isinstance(r.prompt, list) and len(r.prompt) == 5 for r in dw)


# ---------------------------------------------------------------- the request loop against the scripted server
def test_e1_end_to_end_over_http(scripted):
    cfg = LoadConfig(
        url=scripted.url, model="e1", endpoint="chat", num_requests=2, max_concurrency=2, warmup_requests=0
    )
    recs, info = run(cfg, [RequestInput("hi", 2, 64)], chars)
    for r in recs:
        assert r["ok"] and r["output_tokens"] == 6
        # times from the send are scripted at fixed offsets: they can only come out late ...
        assert late_ok(r["ttft_ms"], 500, 120) and late_ok(r["e2el_ms"], 1000, 120)
        # ... while a gap between two of them is shortened when its first event was late: two-sided
        assert r["tpot_ms"] == pytest.approx(100, abs=30)
        assert len(r["itl_ms"]) == 5 and r["chunk_gaps_ms"][1] == pytest.approx(300, abs=80)


def test_client_queue_is_reported_not_hidden(scripted):
    cfg = LoadConfig(url=scripted.url, model="e2a", num_requests=4, max_concurrency=1, warmup_requests=0)
    recs, _ = run(cfg, [RequestInput("hi", 2, 1)], chars)
    queues = sorted(r["client_queue_ms"] for r in recs)
    assert queues[0] < 50 and queues[-1] > 800  # the 4th waited ~3 x 300 ms for its slot ...
    assert all(late_ok(r["ttft_ms"], 300, 120) for r in recs)  # ... and TTFT does not include it


def test_duration_mode_stops_sending(scripted):
    cfg = LoadConfig(
        url=scripted.url, model="normal", num_requests=None, duration_s=0.5, osl=4, max_concurrency=2, warmup_requests=0
    )
    t = time.perf_counter()
    recs, info = run(cfg, [RequestInput("hi", 2, 4)], chars)
    assert time.perf_counter() - t < 3 and len(recs) > 4 and all(r["ok"] for r in recs)


def test_request_rate_spaces_arrivals(scripted):
    cfg = LoadConfig(
        url=scripted.url,
        model="e2b",
        num_requests=6,
        request_rate=20.0,
        max_concurrency=None,
        warmup_requests=0,
        seed=2,
    )
    recs, info = run(cfg, [RequestInput("hi", 2, 1)], chars)
    sent = sorted(r["sent_s"] for r in recs)
    expected = arrival_gaps_s(6, 20.0, 1.0, 2).cumsum()
    assert sent[-1] - sent[0] == pytest.approx(expected[-1] - expected[0], abs=0.1)  # a late first send shortens it
    assert info["x_client_cpu_frac"] >= 0 and info["x_client_bound"] in (True, False)


def test_model_listing_failure_returns_failed_records():
    # the loop itself returns the failed records (it does not raise)
    recs, info = run(LoadConfig(url=dead_url(), num_requests=2, warmup_requests=0), [RequestInput("hi", 2, 4)])
    assert len(recs) == 2 and not any(r["ok"] for r in recs) and "/v1/models" in info["setup_error"]


# ---------------------------------------------------------------- the client self-check
def test_the_lag_probe_samples_an_idle_loop_less_often_and_keeps_10_ms_entries(monkeypatch):
    """An idle client is sampled every 40 ms (a wake-up costs a virtual machine's process tens of µs of CPU),
    each wake standing for four 10 ms entries; a busy or late one every 10 ms; a stall that ends an idle interval
    counts once, as with fixed 10 ms sampling. Driven by a scripted clock: (lag ms, client CPU fraction) per wake."""
    from types import SimpleNamespace

    from kit.serve import selfcheck

    script = [(0.3, 0.01)] * 4 + [(200.0, 1.0)] + [(0.5, 0.5)] * 2 + [(0.2, 0.0)] * 3
    clock = SimpleNamespace(t=0.0, cpu=0.0)
    slept = []

    class Done(Exception):
        pass

    async def fake_sleep(d):
        if not script:
            raise Done
        lag, frac = script.pop(0)
        slept.append(round(d * 1000))
        clock.t += d + lag / 1000
        clock.cpu += frac * (d + lag / 1000)

    monkeypatch.setattr(
        selfcheck, "time", SimpleNamespace(perf_counter=lambda: clock.t, process_time=lambda: clock.cpu)
    )
    monkeypatch.setattr(selfcheck.asyncio, "sleep", fake_sleep)
    probe = LoopProbe()
    with pytest.raises(Done):
        probe._run().send(None)
    assert slept == [10, 40, 40, 40, 40, 10, 10, 10, 40, 40]  # idle: 40 ms; after the stall and while busy: 10 ms
    assert probe.n_wakes == 10
    assert probe.lags_ms == pytest.approx([0.3] + [0.3] * 12 + [0.3] * 3 + [200.0] + [0.5, 0.5, 0.2] + [0.2] * 8)
    with pytest.raises(ValueError, match="idle_interval_s"):
        LoopProbe(0.01, 0.025)
    with pytest.raises(ValueError, match="interval_s"):
        LoopProbe(0.0)


def test_selfcheck_judges_only_runs_with_successful_streams():
    async def busy(n_streamed):
        probe = LoopProbe()
        probe.start()
        await asyncio.sleep(0.05)
        t = time.perf_counter()
        while time.perf_counter() - t < 0.3:  # the client hogs its loop
            pass
        await asyncio.sleep(0.15)
        return await probe.stop(n_streamed)

    assert asyncio.run(busy(0))["x_client_bound"] is False
    judged = asyncio.run(busy(5))  # with successful streams the same run is flagged
    assert judged["x_client_bound"] is True and judged["x_client_check"] == "client-bound"


def test_the_heap_is_frozen_for_the_collector_while_requests_run(scripted):
    """A full garbage collection of a large heap (a notebook kernel's, a test runner's) stalls the event loop for
    tens of ms: during a run the pre-existing heap is frozen (gc.freeze) and unfrozen after."""
    import gc

    seen = []
    cfg = LoadConfig(url=scripted.url, model="e2a", num_requests=2, warmup_requests=0)
    sched = Arrivals.from_config(cfg, [RequestInput("hi", 2, 1)])
    recs, _ = run_coro(run_schedule(cfg, sched, on_progress=lambda n, ok: seen.append(gc.get_freeze_count())))
    assert all(r["ok"] for r in recs) and len(seen) == 2 and min(seen) > 0
    assert gc.get_freeze_count() == 0
