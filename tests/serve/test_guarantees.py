"""Every served mode gets the same guarantees from the one request loop and the point around it: the same
validity verdict, the same /metrics scrape, power columns, client self-check, steady window (or the reason there
is none), measured concurrency and early stop, whether the row came from a closed loop, an open loop, a ramp,
multi-turn sessions or a trace replay. Run against the scripted server with a vLLM-style /metrics route
(tests/metrics_server.py) and a silent port."""

from pathlib import Path

import pytest
from metrics_server import start

from kit.serve.load import LoadConfig
from kit.serve.modes import ServedMode, run_mode
from kit.serve.point import read_detail

TRACE = Path(__file__).parents[1] / "fixtures" / "mooncake_small.jsonl"

#: each mode: (ServedMode fields, LoadConfig overrides, expected x_schedule)
MODES = {
    "closed": ({}, {"max_concurrency": 2}, "closed"),
    "open": ({}, {"max_concurrency": 4, "request_rate": 40.0}, "open"),
    "ramp-rate": ({"ramp": "rate", "ramp_start": 20.0, "ramp_end": 80.0}, {"max_concurrency": 4}, "ramp"),
    "ramp-concurrency": ({"ramp": "concurrency", "ramp_start": 1, "ramp_end": 3}, {}, "ramp"),
    "turns": ({"turns": 3}, {"max_concurrency": 2}, "sessions"),
    "trace": ({"trace": str(TRACE), "time_scale": 0.2}, {}, "trace"),
}


def run_one(url: str, mode: str, out: Path, mode_kw: dict | None = None, **cfg_kw) -> dict:
    """The one row of ``mode`` (its ServedMode fields updated by ``mode_kw``, its LoadConfig by ``cfg_kw``)."""
    fields, overrides, _ = MODES[mode]
    fields = {**fields, **(mode_kw or {})}
    cfg = LoadConfig(url=url, model="normal", num_requests=6, warmup_requests=1, isl=8, osl=4, timeout_s=30)
    cfg = LoadConfig(**{**cfg.__dict__, **overrides, **cfg_kw})
    concs = [cfg.max_concurrency or 1]
    df, _ = run_mode(ServedMode(**fields), cfg, concs, out, progress=False)
    assert len(df) == 1
    return df.iloc[0].to_dict()


@pytest.fixture(scope="module")
def preempting():
    srv = start("vllm", preempt=True, prefix_hits=True)
    yield srv
    srv.stop()


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_is_scraped_checked_and_judged_the_same(preempting, mode, tmp_path):
    row = run_one(preempting.url, mode, tmp_path)
    records = read_detail(row)
    assert row["status"] == "ok" and row["failed"] == 0 and row["x_schedule"] == MODES[mode][2]
    # the /metrics scrape ran around this point, whatever produced it
    assert row["x_server_metrics"] == "vllm"
    client_tokens = sum(int(r["output_tokens"]) for r in records if r["ok"])
    assert row["x_server_generation_tokens"] == client_tokens == row["x_server_client_output_tokens"]
    # ... and the server's preemptions make the row invalid, with the reason, in every mode
    assert row["x_valid"] is False
    assert f"{row['x_server_preemptions']:g} preemption(s) during the point" in row["x_invalid_reasons"]
    assert "preemptions" in row["x_validity_checks"]
    # prefix-cache hits count against modes that promise unique prompts, not against history-resending sessions or
    # a trace whose requests share hash ids (blocks) on purpose
    hits_flagged = "prefix-cache hit tokens although every prompt was unique" in row["x_invalid_reasons"]
    assert hits_flagged == (mode not in ("turns", "trace"))
    # the client self-check judged the run (or said why not), power columns say what was read
    assert row["x_client_cpu_frac"] is not None and row["x_loop_lag_ms_p99"] is not None
    assert row["x_client_check"] in ("ok", "client-bound", "machine contention") or row["x_client_check"].startswith(
        "not applied"
    )
    assert row["x_power_status"] is not None
    # the steady window, or why there is none; the concurrency the client really kept
    assert row["x_steady_note"] is not None or row["x_steady_n"] >= 1
    assert (mode.startswith("ramp")) == str(row["x_steady_note"]).startswith("a ramp has no steady state")
    assert 0 < row["x_inflight_mean"] <= row["x_inflight_max"]
    assert all(r["inflight_at_send"] >= 1 for r in records if r["ok"])


@pytest.mark.slow
def test_a_ramp_records_the_load_of_each_request(preempting, tmp_path):
    row = run_one(preempting.url, "ramp-concurrency", tmp_path / "c", num_requests=8)
    meas = [r for r in read_detail(row) if not r["warmup"]]
    assert [r["offered_concurrency"] for r in meas] == [1, 1, 2, 2, 2, 2, 3, 3]  # round(1 + 2·i/7)
    assert all(r["inflight_at_send"] <= r["offered_concurrency"] for r in meas)
    assert row["concurrency"] == 3 and row["x_ramp_axis"] == "concurrency" and row["x_ramp_end"] == 3
    row = run_one(preempting.url, "ramp-rate", tmp_path / "r", num_requests=5)
    meas = [r for r in read_detail(row) if not r["warmup"]]
    assert [r["offered_rate"] for r in meas] == pytest.approx([20, 35, 50, 65, 80])
    assert all(r["send_late_ms"] >= 0 for r in meas) and row["x_send_late_n"] == 5


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_stops_early_at_a_silent_server(silent_server, mode, tmp_path):
    """The first requests all time out: every mode stops sending and records the rest as not sent (9 requests: three
    conversations of three turns; the trace slowed down so that requests are left when the first ones time out)."""
    slow = {"time_scale": 3.0} if mode == "trace" else None
    kw = {"first_byte_timeout_s": 0.2, "server_metrics": False, "num_requests": 9}
    row = run_one(silent_server.url, mode, tmp_path, slow, **kw)
    records = read_detail(row)
    assert row["status"] == "error" and row["completed"] == 0
    assert row["x_stopped_early"].startswith("stopped early")
    assert any(r.get("not_sent") for r in records) and row["x_valid"] is False
