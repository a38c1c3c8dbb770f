"""kit.serve.client: SSE parsing, cases E1-E3 (exact), arrivals, workloads, aggregation, faults against a scripted
server (500s, stalls, truncated streams, a server killed mid-run, a dead server), the CLI."""
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kit.errors import OutputPathError
from kit import results as R
from kit.serve import client as S
from kit.view.plots import plot_served
from kit.serve import load

sys.path.insert(0, str(Path(__file__).parents[1]))
from sse_server import script, start_in_thread  # noqa: E402

HERE = Path(__file__).parents[1]


def sse_bytes(payload) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def replay(name: str, chat: bool = True, split: bool = False) -> S.StreamCapture:
    """Feed a scripted scenario to the real parser and capture with its *exact* time stamps (t0 = 0)."""
    cap, parser = S.StreamCapture(t_send=0.0), S.SSEParser()
    for t, payload in script(name, chat, 64, 5.0):
        raw = sse_bytes(payload)
        if split:  # the event arrives in two network reads; it completes (and is stamped) at the second
            cap.add_events(parser.feed(raw[:7]), t - 0.01)
            cap.add_events(parser.feed(raw[7:]), t)
        else:
            cap.add_events(parser.feed(raw), t)
    cap.add_events(parser.close(), 99.0)
    cap.finish()
    return cap


def late_ok(measured: float, scripted: float, late: float) -> bool:
    """A time since the request was sent that the server scripted with sleeps (TTFT, E2E): on a busy machine it
    can only come out late (by up to ``late``), never early by more than timer resolution (2 %)."""
    return 0.98 * scripted <= measured <= scripted + late


def chars(text: str) -> int:
    """Stand-in tokenizer for the scripted cases: one token per non-space character."""
    return len(text.strip())


# ---------------------------------------------------------------- E1-E3, exact
@pytest.mark.parametrize("split", [False, True])
def test_e1_role_chunk_multi_token_chunk_usage_chunk(split):
    cap = replay("e1", split=split)
    assert cap.error is None and cap.done
    rec = S.request_record(cap, S.RequestInput("p", 4, 64), S.token_counter(chars))
    assert rec["ok"]
    assert rec["ttft_ms"] == pytest.approx(500.0)  # not 50 (the role-only chunk)
    assert rec["e2el_ms"] == pytest.approx(1000.0)
    assert rec["output_tokens"] == 6 and not rec["output_tokens_estimated"]  # not 4 chunks, not 64
    assert rec["tpot_ms"] == pytest.approx(100.0)
    assert rec["chunk_gaps_ms"] == pytest.approx([100.0, 300.0, 100.0])
    assert rec["itl_ms"] == pytest.approx([100.0] * 5)
    assert 500.0 not in [round(x, 6) for x in rec["itl_ms"]]  # the ITL list never contains the TTFT
    assert rec["osl_mismatch"]  # 6 tokens for max_tokens 64 is flagged


def test_e1_with_continuous_usage_needs_no_tokenizer():
    rec = S.request_record(replay("e1u"), S.RequestInput("p", 4, 64), None)
    assert rec["tokens_per_chunk_source"] == "usage"
    assert rec["itl_ms"] == pytest.approx([100.0] * 5)
    assert rec["output_tokens"] == 6 and rec["tpot_ms"] == pytest.approx(100.0)


def test_e2_one_and_zero_output_tokens():
    a = S.request_record(replay("e2a", chat=False), S.RequestInput("p", 4, 64), S.token_counter(chars))
    assert a["ok"] and a["ttft_ms"] == pytest.approx(300.0) and a["tpot_ms"] is None and a["itl_ms"] == []
    b = S.request_record(replay("e2b", chat=False), S.RequestInput("p", 4, 64), S.token_counter(chars))
    assert b["ok"] and b["output_tokens"] == 0 and b["ttft_ms"] is None and b["tpot_ms"] is None
    c = S.request_record(replay("e2c", chat=False), S.RequestInput("p", 4, 64), None)
    assert c["ok"] and c["output_tokens"] == 2
    assert c["itl_ms"] == pytest.approx([100.0])  # the whitespace chunk (0 tokens) adds no ITL entry
    # B (no usage, tokenizer says whitespace is 0 tokens) gives the same
    cap = replay("e2c", chat=False)
    cap.chunk_usage = [None] * len(cap.chunk_usage)
    assert S.request_record(cap, S.RequestInput("p", 4, 64), S.token_counter(chars))["itl_ms"] == \
        pytest.approx([100.0])
    cfg = S.LoadConfig(url="http://x", slo_tpot_ms=50.0)
    row = load.aggregate([a, b, c], cfg, {"duration_s": 1.0})
    assert row["completed"] == 3 and row["failed"] == 0
    assert row["tpot_n"] == 1  # only C has a TPOT; A (1 token) and B (0 tokens) are excluded, no ZeroDivision
    assert row["x_good_requests"] == 2  # A and B pass the TPOT SLO by definition; C's 100 ms does not


def test_e3_goodput():
    def rec(ttft, tpot, n_out):
        e2el = ttft + (tpot or 0) * (n_out - 1)
        return {"ok": True, "ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": e2el, "output_tokens": n_out,
                "input_tokens": 4, "itl_ms": [], "chunk_gaps_ms": [], "n_chunks": n_out, "client_queue_ms": 0.0}
    recs = [rec(400, 90, 10), rec(600, 50, 10), rec(300, 100, 10), rec(200, None, 1)]
    cfg = S.LoadConfig(url="http://x", slo_ttft_ms=500, slo_tpot_ms=100)
    row = load.aggregate(recs, cfg, {"duration_s": 2.0})
    assert row["x_good_requests"] == 3
    assert row["goodput_rps"] == pytest.approx(1.5)
    assert row["request_throughput"] == pytest.approx(2.0)
    # no SLO given -> goodput missing, not equal to throughput
    assert load.aggregate(recs, S.LoadConfig(url="http://x"), {"duration_s": 2.0})["goodput_rps"] is None


# ---------------------------------------------------------------- parsing details
def test_sse_parser_crlf_multiline_comments_and_eof_without_blank_line():
    p = S.SSEParser()
    out = p.feed(b": keep-alive\r\n\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nevent: x\ndata: [DONE]")
    assert out == ['{"a":\n1}']
    assert p.close() == ["[DONE]"]


def test_classify_events():
    assert S.classify_event({"choices": [], "usage": {"completion_tokens": 3}})[2] == {"completion_tokens": 3}
    assert S.classify_event({"choices": [{"delta": {"role": "assistant"}}]})[0] == ""
    assert S.classify_event({"choices": [{"delta": {"reasoning_content": "hm"}}]})[0] == "hm"
    assert S.classify_event({"choices": [{"text": "", "token_ids": [5, 6]}]})[1] == 2
    assert "boom" in S.classify_event({"object": "error", "message": "boom"})[4]
    assert "boom" in S.classify_event({"error": {"message": "boom"}})[4]


def test_done_is_never_parsed_and_bad_json_is_an_error():
    cap = S.StreamCapture()
    cap.add_events(["[DONE]"], 1.0)
    assert cap.done and cap.error is None
    cap.add_events(["{not json"], 1.1)
    assert "malformed" in cap.error


def test_stream_without_done_finish_or_usage_is_truncated():
    cap = S.StreamCapture()
    cap.add_events([json.dumps({"choices": [{"text": "a"}]})], 0.1)
    cap.finish()
    assert "truncated" in cap.error
    cap2 = S.StreamCapture()
    cap2.add_events([json.dumps({"choices": [{"text": "a", "finish_reason": "length"}]})], 0.1)
    cap2.finish()
    assert cap2.error is None  # transformers serve: no [DONE], but a finish reason


def test_output_tokens_estimated_without_usage():
    cap = S.StreamCapture()
    cap.add_events([json.dumps({"choices": [{"text": "ab", "finish_reason": None}]})], 0.1)
    cap.add_events([json.dumps({"choices": [{"text": "c", "finish_reason": "stop"}]})], 0.2)
    rec = S.request_record(cap, S.RequestInput("p", 1, 3), S.token_counter(chars))
    assert rec["output_tokens"] == 3 and rec["output_tokens_estimated"]
    assert rec["tpot_ms"] == pytest.approx(50.0) and rec["itl_ms"] == pytest.approx([100.0])


# ---------------------------------------------------------------- config, arrivals, workloads
def test_request_body():
    cfg = S.LoadConfig(url="http://x", endpoint="chat", ignore_eos=True, continuous_usage=True,
                       extra_body={"top_k": 1})
    body = S._payload(cfg, "m", S.RequestInput("hello", 1, 7))
    assert body["messages"] == [{"role": "user", "content": "hello"}] and body["max_tokens"] == 7
    assert body["stream"] and body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["ignore_eos"] and body["top_k"] == 1
    plain = S._payload(S.LoadConfig(url="http://x"), "m", S.RequestInput([1, 2], 2, 3))
    assert plain["prompt"] == [1, 2] and "ignore_eos" not in plain and plain["stream_options"] == {"include_usage": True}


def test_config_validation_names_bad_values():
    with pytest.raises(ValueError, match="endpoint='embed'"):
        S.LoadConfig(url="http://x", endpoint="embed").validate()
    with pytest.raises(ValueError, match="max_concurrency=0"):
        S.LoadConfig(url="http://x", max_concurrency=0).validate()
    with pytest.raises(ValueError, match="request_rate=0"):
        S.LoadConfig(url="http://x", request_rate=0).validate()
    with pytest.raises(ValueError, match="url="):
        S.LoadConfig(url="localhost:8000").validate()
    with pytest.raises(ValueError, match="num_requests or duration_s"):
        S.LoadConfig(url="http://x", num_requests=None).validate()
    assert S.LoadConfig(url="http://h:1/v1/").base_url == "http://h:1"


def test_arrivals_gamma_poisson_and_inf():
    assert (load.arrival_gaps_s(5, math.inf) == 0).all()
    g = load.arrival_gaps_s(20000, 10.0, 1.0, seed=1)
    assert g.mean() == pytest.approx(0.1, rel=0.03)
    assert g.std() == pytest.approx(0.1, rel=0.05)  # exponential: std = mean
    bursty = load.arrival_gaps_s(20000, 10.0, 0.25, seed=1)
    assert bursty.mean() == pytest.approx(0.1, rel=0.05) and bursty.std() > 1.8 * g.std()
    assert (load.arrival_gaps_s(10, 5.0, seed=3) == load.arrival_gaps_s(10, 5.0, seed=3)).all()
    with pytest.raises(ValueError):
        load.arrival_gaps_s(3, 1.0, burstiness=0)


def test_workload_presets_and_token_ids():
    assert load.WORKLOAD_PRESETS["seed"] == (1024, 400) and load.WORKLOAD_PRESETS["8k/1k"] == (8192, 1024)
    w = load.build_workload(6, 50, 20, None, seed=1, osl_range=0.5, as_token_ids=True)
    assert all(len(r.prompt) == 50 and r.input_tokens == 50 for r in w)
    assert all(10 <= r.max_tokens <= 30 for r in w) and len({r.max_tokens for r in w}) > 1
    words = load.build_workload(2, 7, 3, None)
    assert len(words[0].prompt.split()) == 7 and words[0].input_tokens is None
    with pytest.raises(ValueError, match="isl_range"):
        load.build_workload(2, 7, 3, None, isl_range=1.5)


# ---------------------------------------------------------------- against the scripted server
@pytest.fixture(scope="module")
def scripted():
    srv = start_in_thread()
    yield srv
    srv.stop()


def test_e1_end_to_end_over_http(scripted):
    cfg = S.LoadConfig(url=scripted.url, model="e1", endpoint="chat", num_requests=2, max_concurrency=2,
                       warmup_requests=0)
    recs, info = load.run_coro(load.run_load_async(cfg, [S.RequestInput("hi", 2, 64)], tokenizer=chars))
    for r in recs:
        assert r["ok"] and r["output_tokens"] == 6
        # times from the send are scripted at fixed offsets: they can only come out late ...
        assert late_ok(r["ttft_ms"], 500, 120) and late_ok(r["e2el_ms"], 1000, 120)
        # ... while a gap between two of them is shortened when its first event was late: two-sided
        assert r["tpot_ms"] == pytest.approx(100, abs=30)
        assert len(r["itl_ms"]) == 5 and r["chunk_gaps_ms"][1] == pytest.approx(300, abs=80)


def test_client_queue_is_reported_not_hidden(scripted):
    cfg = S.LoadConfig(url=scripted.url, model="e2a", num_requests=4, max_concurrency=1, warmup_requests=0)
    recs, _ = load.run_coro(load.run_load_async(cfg, [S.RequestInput("hi", 2, 1)], tokenizer=chars))
    queues = sorted(r["client_queue_ms"] for r in recs)
    assert queues[0] < 50 and queues[-1] > 800  # the 4th waited ~3 x 300 ms for its slot ...
    assert all(late_ok(r["ttft_ms"], 300, 120) for r in recs)  # ... and TTFT does not include it


def test_fault_500_on_every_other_request(scripted, tmp_path):
    cfg = S.LoadConfig(url=scripted.url, model="flaky", num_requests=6, max_concurrency=1, warmup_requests=0,
                       osl=8)
    row = load.run_point(cfg, tmp_path, tokenizer=chars)
    assert row["completed"] == 3 and row["failed"] == 3 and row["status"] == "ok"
    assert "HTTP 500" in row["error"]
    df = R.load_results(tmp_path)
    assert int(df["failed"].iloc[0]) == 3
    detail = [json.loads(x) for x in Path(row["x_detail_file"]).read_text().splitlines()]
    assert len(detail) == 6 and sum(not d["ok"] for d in detail) == 3
    assert all("injected failure" in d["error"] for d in detail if not d["ok"])


def test_fault_stall_past_the_timeout(scripted, tmp_path):
    cfg = S.LoadConfig(url=scripted.url, model="stall", num_requests=2, max_concurrency=2, warmup_requests=0,
                       stall_timeout_s=0.4, timeout_s=5)
    t = time.perf_counter()
    row = load.run_point(cfg, tmp_path, tokenizer=chars)
    assert time.perf_counter() - t < 5
    assert row["failed"] == 2 and row["completed"] == 0 and row["status"] == "error"
    assert "stalled" in row["error"]
    assert R.load_results(tmp_path)["failed"].iloc[0] == 2


def test_fault_truncated_stream(scripted, tmp_path):
    cfg = S.LoadConfig(url=scripted.url, model="truncate", num_requests=2, warmup_requests=0)
    row = load.run_point(cfg, tmp_path, tokenizer=chars)
    assert row["failed"] == 2 and "broken stream" in row["error"]


def test_fault_total_timeout(scripted, tmp_path):
    cfg = S.LoadConfig(url=scripted.url, model="slow", num_requests=1, warmup_requests=0, osl=100,
                       timeout_s=0.5, stall_timeout_s=5)
    row = load.run_point(cfg, tmp_path, tokenizer=chars)
    assert row["failed"] == 1 and "exceeded" in row["error"]


def test_dead_server_finishes_with_failures(tmp_path):
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    row = load.run_point(S.LoadConfig(url=url, model="m", num_requests=3, warmup_requests=1), tmp_path / "a")
    assert row["failed"] == 3 and row["completed"] == 0 and "connection failed" in row["error"]
    row = load.run_point(S.LoadConfig(url=url, num_requests=3), tmp_path / "b")  # model lookup fails
    assert row["status"] == "error" and "/v1/models" in row["error"]
    assert R.load_results(tmp_path / "b")["status"].iloc[0] == "error"


def test_server_killed_mid_run(tmp_path):
    proc = subprocess.Popen([sys.executable, str(HERE / "sse_server.py"), "--port", "0", "--gap-ms", "5"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), line
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        cfg = S.LoadConfig(url=url, model="normal", num_requests=12, max_concurrency=2, warmup_requests=0,
                           osl=60, timeout_s=10, stall_timeout_s=2)
        killer = threading.Timer(0.7, lambda: os.killpg(proc.pid, 9))
        killer.start()
        t = time.perf_counter()
        row = load.run_point(cfg, tmp_path, tokenizer=chars)
        killer.join()
        assert time.perf_counter() - t < 10
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait(5)
    assert row["completed"] >= 1 and row["failed"] >= 1 and row["completed"] + row["failed"] == 12
    df = R.load_results(tmp_path)
    assert int(df["failed"].iloc[0]) == row["failed"]
    detail = Path(row["x_detail_file"]).read_text().splitlines()
    assert len(detail) == 12


def test_api_key_is_sent_but_never_written(scripted, tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_TEST_API_KEY", "sk-very-secret-123")
    cfg = S.LoadConfig(url=scripted.url, model="e2a", num_requests=2, api_key_env="KIT_TEST_API_KEY")
    assert S._headers(cfg)["Authorization"] == "Bearer sk-very-secret-123"
    load.run_sweep(cfg, [1, 2], tmp_path, tokenizer=chars, progress=False)
    for f in tmp_path.iterdir():
        assert "sk-very-secret-123" not in f.read_bytes().decode("utf-8", "replace"), f


def test_sweep_rows_concat_with_in_process_rows_and_plot(scripted, tmp_path):
    cfg = S.LoadConfig(url=scripted.url, model="normal", num_requests=4, osl=16, warmup_requests=1,
                       slo_ttft_ms=1000)
    df = load.run_sweep(cfg, [1, 2], tmp_path, tokenizer=chars, extra={"n_gpus": 1}, progress=False)
    assert list(df["backend"]) == ["openai", "openai"] and list(df["concurrency"]) == [1, 2]
    assert (df["completed"] == 4).all() and (df["x_output_tokens_total"] == 64).all()
    assert df["goodput_rps"].notna().all() and df["tok_s_per_gpu"].notna().all()
    assert df["tpot_n"].iloc[0] == 4 and df["itl_n"].iloc[0] == 4 * 15
    engine = {"backend": "engine", "status": "ok", "model": "tiny", "concurrency": 2, "decode_tok_s": 500.0,
              "tpot_ms_p50": 4.0, "tok_s_per_stream": 250.0, "n_gpus": 1}
    both = R.to_frame(R.load_results(tmp_path).to_dict("records") + [engine])
    assert set(both["backend"]) == {"openai", "engine"} and len(both) == 3
    fig = plot_served(both)
    fig.savefig(tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_duration_mode_stops_sending(scripted):
    cfg = S.LoadConfig(url=scripted.url, model="normal", num_requests=None, duration_s=0.5, osl=4,
                       max_concurrency=2, warmup_requests=0)
    t = time.perf_counter()
    recs, info = load.run_coro(load.run_load_async(cfg, [S.RequestInput("hi", 2, 4)], tokenizer=chars))
    assert time.perf_counter() - t < 3 and len(recs) > 4 and all(r["ok"] for r in recs)


def test_request_rate_spaces_arrivals(scripted):
    cfg = S.LoadConfig(url=scripted.url, model="e2b", num_requests=6, request_rate=20.0, max_concurrency=None,
                       warmup_requests=0, seed=2)
    recs, info = load.run_coro(load.run_load_async(cfg, [S.RequestInput("hi", 2, 1)], tokenizer=chars))
    sent = sorted(r["sent_s"] for r in recs)
    expected = load.arrival_gaps_s(6, 20.0, 1.0, 2).cumsum()
    assert sent[-1] - sent[0] == pytest.approx(expected[-1] - expected[0], abs=0.1)  # a late first send shortens it
    assert info["x_client_cpu_frac"] >= 0 and info["x_client_bound"] in (True, False)


def test_cli_serve_bench(scripted, tmp_path):
    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "kit.cli", "serve-bench", "--url", scripted.url, "--model", "normal",
           "--concurrency", "1,2", "--isl", "8", "--osl", "8", "--num-requests", "3", "--warmup", "0",
           "--tokenizer", "", "--out", str(out), "--plot"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=HERE.parent)
    assert p.returncode == 0, p.stderr + p.stdout
    df = R.load_results(out)
    assert list(df["concurrency"]) == [1, 2] and (df["completed"] == 3).all()
    assert (out / "serve-bench.png").exists()
    bad = subprocess.run([sys.executable, "-m", "kit.cli", "serve-bench", "--url", "localhost:1"],
                         capture_output=True, text=True, timeout=60, cwd=HERE.parent)
    assert bad.returncode == 2 and "url='localhost:1'" in bad.stderr


# ---------------------------------------------------------------- new-user trial regressions
@pytest.fixture
def silent_server():
    """A port that accepts TCP connections (kernel backlog) but never answers; ``.pending()`` says whether a
    client connected."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)

    class Silent:
        url = f"http://127.0.0.1:{s.getsockname()[1]}"

        @staticmethod
        def pending() -> bool:
            s.setblocking(False)
            try:
                conn, _ = s.accept()
            except BlockingIOError:
                return False
            conn.close()
            return True

    yield Silent
    s.close()


def _dead_url() -> str:
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_model_listing_failure_counts_every_planned_request(tmp_path):
    url = _dead_url()
    row = load.run_point(S.LoadConfig(url=url, num_requests=3, warmup_requests=2), tmp_path / "a")
    assert row["failed"] == 3 and row["completed"] == 0 and row["status"] == "error"
    assert "cannot list models" in row["error"] and "/v1/models" in row["error"]
    detail = [json.loads(x) for x in Path(row["x_detail_file"]).read_text().splitlines()]
    assert len(detail) == 5 and sum(d["warmup"] for d in detail) == 2
    assert all(not d["ok"] and "cannot list models" in d["error"] for d in detail)
    assert int(R.load_results(tmp_path / "a")["failed"].iloc[0]) == 3
    # a sweep lists the models once and records every point the same way
    df = load.run_sweep(S.LoadConfig(url=url, num_requests=4, warmup_requests=0), [1, 2], tmp_path / "b",
                     progress=False)
    assert list(df["failed"]) == [4, 4] and list(df["completed"]) == [0, 0]
    # a duration-only run plans no count: one failed request
    row = load.run_point(S.LoadConfig(url=url, num_requests=None, duration_s=1.0, warmup_requests=0))
    assert row["failed"] == 1
    # run_load_async itself returns the failed records (it no longer raises)
    recs, info = load.run_coro(load.run_load_async(S.LoadConfig(url=url, num_requests=2, warmup_requests=0),
                                             [S.RequestInput("hi", 2, 4)]))
    assert len(recs) == 2 and not any(r["ok"] for r in recs) and "/v1/models" in info["setup_error"]


def test_silent_server_timeouts_are_descriptive_and_honour_timeout_s(silent_server, tmp_path):
    url = silent_server.url
    t = time.perf_counter()
    with pytest.raises(ValueError) as ei:
        load.run_coro(S.get_model_id(url, timeout_s=0.5))
    assert time.perf_counter() - t < 3
    msg = str(ei.value)
    assert f"{url}/v1/models" in msg and "timed out after 0.5 s" in msg and "TimeoutError: )" not in msg
    # no model given: the listing waits at most timeout_s, then every planned request fails with that text
    t = time.perf_counter()
    row = load.run_point(S.LoadConfig(url=url, num_requests=2, warmup_requests=0, timeout_s=0.5), tmp_path / "a")
    assert time.perf_counter() - t < 3 and row["failed"] == 2 and "timed out after 0.5 s" in row["error"]
    # requests: silence before any response (stall timeout) and the total timeout, each with what/when/where
    row = load.run_point(S.LoadConfig(url=url, model="m", num_requests=1, warmup_requests=0, timeout_s=5,
                                   stall_timeout_s=0.4), tmp_path / "b")
    assert f"no response from {url}/v1/completions within 0.4 s" in row["error"]
    row = load.run_point(S.LoadConfig(url=url, model="m", num_requests=1, warmup_requests=0, timeout_s=0.4,
                                   stall_timeout_s=5), tmp_path / "c")
    assert f"request to {url}/v1/completions exceeded 0.4 s" in row["error"]
    import asyncio

    assert S.describe_exception(asyncio.TimeoutError()) == "TimeoutError: no details"


def _cli(argv, capsys):
    from kit.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_concurrency_is_checked_by_argparse(capsys):
    rc, _, err = _cli(["serve-bench", "--url", "http://127.0.0.1:1", "--concurrency", "1k"], capsys)
    assert rc == 2 and "argument --concurrency: '1k' is not an integer (expected a comma list like 1,4,16)" in err
    rc, _, err = _cli(["serve-bench", "--url", "http://127.0.0.1:1", "--concurrency", "1,,4"], capsys)
    assert rc == 2 and "argument --concurrency" in err and "empty item" in err
    rc, _, err = _cli(["serve-bench", "--url", "http://127.0.0.1:1", "--concurrency", "0"], capsys)
    assert rc == 2 and "argument --concurrency: '0'" in err
    from kit.serve.load import _concurrency_list

    assert _concurrency_list(" 1, 4 ,16") == [1, 4, 16]


def test_cli_out_file_rejected_before_network(silent_server, tmp_path, capsys):
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    t = time.perf_counter()
    rc, _, err = _cli(["serve-bench", "--url", silent_server.url, "--out", str(f)], capsys)
    assert rc == 2 and "exists and is a file" in err and time.perf_counter() - t < 5
    assert not silent_server.pending()  # nothing connected to the server
    with pytest.raises(OutputPathError):
        load.run_sweep(S.LoadConfig(url=silent_server.url), [1], f / "sub", progress=False)
    with pytest.raises(OutputPathError):
        load.run_point(S.LoadConfig(url=silent_server.url, model="m"), f)
    assert not silent_server.pending()


def test_html_error_page_is_one_short_line_in_the_summary(scripted, tmp_path):
    cfg = S.LoadConfig(url=scripted.url, model="html502", num_requests=2, warmup_requests=0)
    row = load.run_point(cfg, tmp_path, tokenizer=chars)
    assert row["failed"] == 2 and "HTTP 502: 502 Bad Gateway" in row["error"]
    line = load.summary_line(row)
    for text in (row["error"], line):
        assert "<" not in text and "\n" not in text and "\r" not in text
    assert len(row["error"]) < 300
    detail = [json.loads(x) for x in Path(row["x_detail_file"]).read_text().splitlines()]
    assert all("<title>502 Bad Gateway</title>" in d["error"] for d in detail)  # full text kept there
    long = S.short_error("HTTP 500: " + "word " * 200, 80)
    assert len(long) == 80 and long.endswith("…")
    assert S.short_error("HTTP 404: <p>Not &amp; found</p>\n<p>sorry</p>") == "HTTP 404: Not & found sorry"


def test_selfcheck_not_applied_without_successful_streams(tmp_path):
    row = load.run_point(S.LoadConfig(url=_dead_url(), model="m", num_requests=20, max_concurrency=4,
                                   warmup_requests=0), tmp_path)
    assert row["failed"] == 20
    assert row["x_client_bound"] is False and row["x_client_warning"] is None
    assert row["x_client_check"].startswith("not applied: no successful streamed request")
    line = load.summary_line(row)
    assert "self-check not applied" in line and "may be the bottleneck" not in line

    import asyncio

    from kit.serve.load import _LoopProbe

    async def busy(n_streamed):
        probe = _LoopProbe()
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


def test_cli_help_shows_defaults_once(capsys):
    rc, out, _ = _cli(["serve-bench", "--help"], capsys)
    assert rc == 0
    text = " ".join(out.split())
    for s in ("comma-separated max concurrency values (default: 1,4,16)",
              "measured requests per concurrency point (default: 64)", "(default: 600.0)",
              "longest silence within a stream (default: 60.0)", "warm-up requests per point (excluded) (default: 2)",
              "(default: OPENAI_API_KEY)", "(default: results/serve-bench)", "(default: completions)"):
        assert s in text, s
    assert "default: None" not in text and "default: False" not in text
    assert "(default inf: all at once)" in text and "(default inf: all at once) (default" not in text
    assert "(default: first of /v1/models)" in text and "(default: first of /v1/models) (default" not in text


def test_cli_serve_bench_ctrl_c_keeps_finished_points(scripted, tmp_path):
    """Ctrl-C during the second point: exit 130, a one-line message naming the output dir, no traceback, and
    the first point's row is on disk."""
    import signal

    out = tmp_path / "int"
    cmd = [sys.executable, "-m", "kit.cli", "serve-bench", "--url", scripted.url, "--model", "normal",
           "--concurrency", "1,2,3", "--isl", "8", "--osl", "64", "--num-requests", "8", "--warmup", "0",
           "--tokenizer", "", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE.parent)
    deadline = time.time() + 60
    while time.time() < deadline and not ((out / "points.jsonl").exists() and (out / "points.jsonl").read_text()):
        time.sleep(0.05)
    time.sleep(0.3)  # inside the second point's requests
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout + err
    assert "interrupted" in err and str(out) in err and "Traceback" not in err, err
    assert 1 <= len(R.load_results(out)) < 3


def test_ctrl_c_swallowed_by_a_finaliser_stops_the_served_sweep(scripted, tmp_path, monkeypatch):
    """The kind of fault of the engine-sweep case: a SIGINT raised inside a finaliser is not lost."""
    import signal

    from kit.serve import load as loadgen

    class Finaliser:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)

    real, calls = loadgen.run_point, []

    def run_point(*a, **k):
        calls.append(1)
        row = real(*a, **k)
        obj = Finaliser()
        del obj
        return row

    monkeypatch.setattr(loadgen, "run_point", run_point)
    cfg = S.LoadConfig(url=scripted.url, model="normal", num_requests=2, osl=8, warmup_requests=0)
    with pytest.raises(KeyboardInterrupt):
        load.run_sweep(cfg, [1, 2, 4], tmp_path, tokenizer=chars, progress=False)
    assert len(calls) == 1 and len(R.load_results(tmp_path)) == 1
