"""Hardening of the served benchmark: a full disk keeps the finished point and stops the run, no secret leaks
(proxy, echoed credentials, a secret cut by truncation, a key with a line break), no stream wedges the client
(endless streams capped), and numbers a server cannot mean are refused (buffered streams, usage counts that are
not counts). Each kind with a test that failed before its fix; servers are small aiohttp apps on 127.0.0.1."""

import asyncio
import base64
import json
import re
import socket
import threading
from pathlib import Path

import pytest
from aiohttp import web
from metrics_server import start as start_metrics
from sse_server import chars

from kit.errors import OutputPathError, UserError
from kit.serve import point as point_mod
from kit.serve.cli import summary_line
from kit.serve.http1 import build_request
from kit.serve.load import LoadConfig
from kit.serve.point import measure_point
from kit.serve.redact import scrub, secrets_of
from kit.serve.server_metrics import scrape
from kit.serve.simserver import SimModel, SimServer
from kit.serve.sweep import run_served_sweep
from kit.store import load_results


class App:
    """An aiohttp app on 127.0.0.1 in a background thread (``url``; ``stop()``)."""

    def __init__(self, routes):
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(routes,), daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _main(self, routes):
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.add_routes(routes)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def chunk(text="t", usage=None, finish=None) -> bytes:
    obj = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage is not None:
        obj = {"id": "x", "object": "text_completion", "choices": [], "usage": usage}
    return f"data: {json.dumps(obj)}\n\n".encode()


async def stream(req: web.Request, frames, gap_s: float = 0.0):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(req)
    for f in frames:
        await resp.write(f)
        if gap_s:
            await asyncio.sleep(gap_s)
    await resp.write_eof()
    return resp


# ---------------------------------------------------------------- a full disk
@pytest.mark.slow
def test_a_full_disk_keeps_the_finished_point_and_stops_sending(scripted, tmp_path, monkeypatch):
    """The disk refuses the first point's detail file: its row (every figure) is kept, and no request of the next
    points is sent; the run ends with one line saying so."""

    def full(path, text):
        raise OutputPathError(f"cannot write {path}: [Errno 28] No space left on device")

    monkeypatch.setattr(point_mod, "atomic_write_text", full)
    n0 = len(scripted.requests)
    cfg = LoadConfig(url=scripted.url, model="normal", num_requests=3, warmup_requests=0, osl=4)
    with pytest.raises(OutputPathError, match="No space left on device"):
        run_served_sweep(cfg, [1, 2, 4], tmp_path, tokenizer=chars, progress=False)
    rows = load_results(tmp_path)
    assert len(rows) == 1 and rows["completed"].iloc[0] == 3 and rows["concurrency"].iloc[0] == 1
    assert "No space left" in rows["x_detail_error"].iloc[0] and rows["x_detail_file"].isna().all()
    assert len(scripted.requests) - n0 == 3  # the points after it sent nothing


# ---------------------------------------------------------------- secrets
def test_the_metrics_scrape_never_goes_through_an_environment_proxy(monkeypatch):
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(4)
    proxy.settimeout(0.3)
    srv = start_metrics("vllm")
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.getsockname()[1]}")
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.getsockname()[1]}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        snap = scrape(srv.url.replace("http://", "http://user:hunter22@"), timeout_s=3)
        assert snap.error is None and snap.server == "vllm"
        with pytest.raises(TimeoutError):
            proxy.accept()  # the proxy never saw the credentials (nor anything else)
    finally:
        srv.stop()
        proxy.close()


@pytest.mark.slow
def test_an_echoed_authorization_header_reaches_no_file_and_no_printed_line(tmp_path, monkeypatch, capsys):
    """A server that answers 401 quoting the request's Authorization header (base64 user:pass) and the API key,
    with the key cut in half by the kit's error-body limit: none of it is in the detail file, the log, the Parquet
    file or the summary line."""
    key = "sk-live-0123456789abcdefSECRET"
    monkeypatch.setenv("KIT_TEST_KEY", key)

    async def echo(req):
        pad = "x" * (1980 - len(req.headers.get("Authorization", "")))  # 12 key characters before the 2000-byte cut
        return web.Response(status=401, text=f"denied {req.headers.get('Authorization')} {pad}{key}")

    app = App([web.post("/v1/completions", echo)])
    try:
        url = app.url.replace("http://", "http://alice:pa55word@")
        cfg = LoadConfig(url=url, model="m", num_requests=2, warmup_requests=0, api_key_env="KIT_TEST_KEY")
        run_served_sweep(cfg, [1], tmp_path, progress=False)
        row = load_results(tmp_path).iloc[0].to_dict()
        print(summary_line(row))
    finally:
        app.stop()
    basic = base64.b64encode(b"alice:pa55word").decode()
    texts = [p.read_bytes().decode("utf-8", "replace") for p in tmp_path.rglob("*") if p.is_file()]
    texts.append(capsys.readouterr().out)
    assert row["failed"] == 2 and "HTTP 401" in row["error"]
    for text in texts:
        for secret in (basic, "pa55word", key, key[:12]):
            assert secret not in text


def test_a_secret_cut_by_the_end_or_start_of_a_text_is_masked():
    key = "sk-live-0123456789abcdef"
    assert scrub(f"error body ... {key[:10]}", [key]) == "error body ... ***"
    assert scrub(f"{key[-9:]} and more", [key]) == "*** and more"
    assert scrub("nothing here", [key]) == "nothing here"
    assert base64.b64encode(b"bob:s3cret").decode() in secrets_of("http://bob:s3cret@h:1")


def test_an_api_key_with_a_line_break_is_refused_before_any_request(monkeypatch):
    monkeypatch.setenv("KIT_TEST_KEY", "sk-abc\r\nX-Injected: 1")
    with pytest.raises(UserError, match=r"\$KIT_TEST_KEY holds a line break"):
        LoadConfig(url="http://127.0.0.1:9", model="m", api_key_env="KIT_TEST_KEY").validate()
    with pytest.raises(ValueError, match="line break"):
        build_request("http://h:1/v1/completions", b"{}", {"X-A": "b\r\nX-B: c"})


# ---------------------------------------------------------------- streams and numbers
@pytest.mark.slow
def test_an_endless_stream_of_valid_tokens_is_cut_and_the_request_fails():
    async def endless(req):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        try:
            while True:
                await resp.write(chunk() * 64)
                await asyncio.sleep(0)
        except (ConnectionError, RuntimeError):
            return resp

    app = App([web.post("/v1/completions", endless)])
    try:
        cfg = LoadConfig(url=app.url, model="m", num_requests=1, warmup_requests=0, osl=4, timeout_s=30)
        row = measure_point(cfg)
    finally:
        app.stop()
    assert row["failed"] == 1 and "more than 1024 events for one request" in row["error"]


@pytest.mark.slow
def test_a_buffered_stream_has_no_per_token_timing_and_is_flagged(tmp_path):
    """A proxy that buffers: the 12 token events arrive in one read; TPOT and ITL are unknown, never 0 ms."""

    async def buffered(req):
        await asyncio.sleep(0.05)
        return await stream(req, [b"".join([chunk()] * 12 + [chunk(usage={"completion_tokens": 12})])])

    app = App([web.post("/v1/completions", buffered)])
    try:
        cfg = LoadConfig(url=app.url, model="m", num_requests=2, warmup_requests=0, osl=12)
        row = measure_point(cfg, out_dir=tmp_path)
    finally:
        app.stop()
    detail = [json.loads(x) for x in Path(row["x_detail_file"]).read_text().splitlines()]
    assert all(r["buffered"] and r["tpot_ms"] is None and r["itl_ms"] is None for r in detail)
    assert row["completed"] == 2 and row["tpot_n"] == 0 and row["x_buffered_requests"] == 2
    assert not row["x_valid"] and "arrived whole in one network read" in row["x_invalid_reasons"]


@pytest.mark.slow
@pytest.mark.parametrize("count", [10**30, -5, 2.5, "12"])
def test_usage_that_is_not_a_token_count_fails_the_request_and_is_stored_cleanly(count, tmp_path):
    async def lying(req):
        return await stream(req, [chunk(), chunk(), chunk(usage={"completion_tokens": count, "prompt_tokens": 3})])

    app = App([web.post("/v1/completions", lying)])
    try:
        cfg = LoadConfig(url=app.url, model="m", num_requests=2, warmup_requests=0, osl=2)
        run_served_sweep(cfg, [1], tmp_path, progress=False)
    finally:
        app.stop()
    row = load_results(tmp_path).iloc[0]  # the Parquet write held
    assert row["failed"] == 2 and f"usage.completion_tokens={count!r} is not a token count" in row["error"]
    assert not (row["output_tok_s"] < 0)


@pytest.mark.slow
def test_an_slo_search_names_probes_whose_requests_failed_and_stops_there(scripted, tmp_path):
    """'flaky' answers every other request with HTTP 500: that is an error verdict, not a latency miss; the search
    stops at that probe and its line says why (before, three runs gave three answers and named no error)."""
    from kit.serve.slo import slo_search

    cfg = LoadConfig(url=scripted.url, model="flaky", num_requests=4, warmup_requests=0, osl=2, slo_ttft_ms=5000)
    res = slo_search(cfg, tmp_path, progress=False)
    assert list(res.probes["verdict"]) == ["errors"] and res.answer is None
    assert "the search stopped at concurrency 1: 2 of 4 requests failed" in res.line and "HTTP 500" in res.line


# ---------------------------------------------------------------- bounded inputs
@pytest.mark.parametrize(
    "line, what",
    [
        ('{"timestamp": Infinity, "input_length": 8, "output_length": 2}', "timestamp=inf"),
        ('{"timestamp": 1e12, "input_length": 8, "output_length": 2}', "timestamp=1000000000000.0"),
        ('{"timestamp": 0, "input_length": 1000000000, "output_length": 2}', "input_length=1000000000"),
        ('{"timestamp": 0, "input_length": 8.5, "output_length": 2}', "input_length=8.5"),
        ('{"timestamp": 0, "input_length": 8, "output_length": true}', "output_length=True"),
        ('{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": 5}', "hash_ids (int)"),
        ("[1, 2]", "is not a trace entry"),
    ],
)
def test_a_trace_value_out_of_bounds_is_one_line_naming_it(tmp_path, line, what):
    from kit.serve.trace import load_trace

    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 8, "output_length": 2}\n' + line + "\n")
    with pytest.raises(UserError, match=rf"t.jsonl:2: .*{re.escape(what)}"):
        load_trace(p)


def test_huge_hash_lists_and_non_utf8_traces_are_refused_before_allocating(tmp_path):
    from kit.serve.trace import load_trace, trace_workload

    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": list(range(200_000))}))
    with pytest.raises(UserError, match="hash_ids \\(200000\\) must be a list of at most input_length=8"):
        load_trace(p)
    p.write_bytes(b'{"timestamp": 0, "input_length": 8, "output_length": 2}\n\xff\xfe{"x": 1}\n')
    with pytest.raises(UserError, match="t.jsonl:2: not UTF-8 text"):
        load_trace(p)
    # ids past the prompt's length are never materialised: 8 tokens need one block
    p.write_text(json.dumps({"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [1, 2, 3, 4, 5, 6]}))
    (req,) = trace_workload(load_trace(p), block_tokens=16)
    assert len(req.prompt) == 8


@pytest.mark.parametrize(
    "mode, allowed",
    [
        ({"time_scale": float("inf")}, "--time-scale=inf; must be a finite number > 0 and <= 1,000"),
        ({"think_time_s": float("inf")}, "--think-time-s=inf; must be a finite number >= 0 and <= 3,600"),
        ({"turns": 1_000_000}, "--turns=1000000; must be an integer >= 1 and <= 1,000"),
        ({"turns": 2.5}, "--turns=2.5; must be an integer"),
        ({"turns": "x"}, "--turns='x'; must be an integer"),
        ({"turns": float("nan")}, "--turns=nan; must be an integer"),
        ({"ramp": "rate", "ramp_start": "1"}, "--ramp-start='1'; must be a finite number"),
        ({"ramp": "rate", "ramp_end": float("inf")}, "--ramp-end=inf; must be a finite number"),
        ({"ramp": "rate", "ramp_start": 40, "ramp_end": 5}, "--ramp-end 5 < --ramp-start 40: a ramp rises"),
        ({"ramp": "concurrency", "ramp_start": 0.3, "ramp_end": 0.6}, "concurrencies in \\[1, 65,536\\]"),
        ({"ramp": "concurrency", "ramp_end": 1e9}, "--ramp-end=1000000000.0; must be a finite number > 0 and <="),
        ({"max_load": 0}, "--max-load=0; must be a finite number > 0"),
    ],
)
def test_mode_settings_that_would_never_end_are_refused(mode, allowed):
    from kit.serve.modes import ServedMode

    with pytest.raises(UserError, match=allowed if "\\[" in allowed else re.escape(allowed)):
        ServedMode(**mode).validate()


@pytest.mark.slow
def test_turns_never_exceed_the_requests_asked_for(tmp_path):
    """--turns larger than --num-requests: one conversation of num_requests turns, not a million requests."""
    from kit.serve.sessions import SessionBackend

    with SimServer(SimModel(ttft_base_ms=1, tpot_base_ms=1)) as sim:
        cfg = LoadConfig(url=sim.url, model="sim", num_requests=5, isl=4, osl=2)
        backend = SessionBackend(cfg, [1], tmp_path, turns=1000)
        sched = backend.schedule_for(backend.points()[0])
        assert sched.planned == 5 and len(sim.log) == 0
        cfg = LoadConfig(url=sim.url, model="sim", num_requests=7, isl=4, osl=2)
        backend = SessionBackend(cfg, [2], tmp_path / "b", turns=3)
        sched = backend.schedule_for(backend.points()[0])
        assert sched.planned == 7 and [len(m) for m in sched.messages] == [3, 3, 1]


def test_a_model_list_that_is_not_one_is_a_one_line_error():
    from kit.serve.client import get_model_id
    from kit.serve.loop import run_coro

    async def bad(req):
        return web.json_response({"data": 5})

    app = App([web.get("/v1/models", bad)])
    try:
        with pytest.raises(UserError, match="lists no model"):
            run_coro(get_model_id(app.url, timeout_s=5))
    finally:
        app.stop()


# ---------------------------------------------------------------- the front door's served options
@pytest.mark.parametrize(
    "kw, message",
    [
        ({"concurrency": None}, "concurrency=None: give an integer >= 1 or a list of them"),
        ({"concurrency": [0]}, "concurrency=0; must be an integer >= 1"),
        ({"out_dir": None}, "out_dir=None: give a directory"),
        ({"group_size": 2}, "unknown option(s) ['group_size']"),
        ({"model_error": "boom"}, "unknown option(s) ['model_error']"),
        ({"ramp": "rate", "request_rate": 3.0}, "--request-rate 3 with --ramp rate"),
        ({"request_rate": 1e-9}, "the sends would take"),
        ({"ramp": "rate", "ramp_start": 1e-9, "ramp_end": 1e-9}, "would take"),
    ],
)
def test_serve_bench_refuses_bad_options_in_one_line(kw, message, tmp_path):
    from kit.serve.modes import serve_bench

    args = {"concurrency": [1], "out_dir": tmp_path, "model": "m", "num_requests": 4} | kw
    with pytest.raises(UserError, match=re.escape(message)):
        serve_bench("http://127.0.0.1:9", args.pop("concurrency"), **args)


def test_a_scalar_prefix_fraction_is_one_value():
    from kit.serve.modes import ServedMode

    assert ServedMode(prefix_fraction=0.5).validate().prefix_fraction == [0.5]


@pytest.mark.slow
def test_a_dead_server_is_named_as_such(tmp_path):
    from sse_server import dead_url

    from kit.serve.client import get_model_id
    from kit.serve.loop import run_coro

    url = dead_url()
    with pytest.raises(UserError, match="cannot connect: .*is a server running there"):
        run_coro(get_model_id(url, timeout_s=3))


@pytest.mark.slow
def test_the_duration_ends_the_sends_due_after_it(tmp_path):
    """A request due after --duration-s is not waited for (was: waited for forever at a tiny rate)."""
    import time

    with SimServer(SimModel(ttft_base_ms=1, tpot_base_ms=1)) as sim:
        cfg = LoadConfig(url=sim.url, model="sim", num_requests=3, warmup_requests=0, isl=4, osl=2, seed=1)
        cfg.request_rate, cfg.duration_s = 0.001, 1.0  # the first send is due after ~1000 s
        t = time.perf_counter()
        row = measure_point(cfg, out_dir=tmp_path)
        assert time.perf_counter() - t < 5 and row["completed"] == 0 and len(sim.log) == 0


def test_an_interrupt_inside_a_side_task_stops_the_run_and_is_not_reported_again(capfd, caplog):
    """A Ctrl-C that lands while the loop probe (a side task) holds the loop: the caller gets the KeyboardInterrupt;
    no "Task exception was never retrieved" traceback follows it on stderr or in the log."""
    import gc

    from kit.serve.loop import run_coro

    async def side():
        await asyncio.sleep(0)
        raise KeyboardInterrupt

    async def main():
        task = asyncio.ensure_future(side())
        await asyncio.sleep(5)
        return task

    with pytest.raises(KeyboardInterrupt):
        run_coro(main())
    gc.collect()
    err = capfd.readouterr().err + caplog.text
    assert "never retrieved" not in err and "Traceback" not in err, err

    async def broken():  # any other error of a side task is still reported
        raise ValueError("a side task's bug")

    async def main2():
        asyncio.ensure_future(broken())
        await asyncio.sleep(0.01)

    run_coro(main2())
    gc.collect()
    assert "a side task's bug" in capfd.readouterr().err + caplog.text
