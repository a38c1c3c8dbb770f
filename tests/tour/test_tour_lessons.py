"""The tour's lessons, its generation and ``kit tour --check``, in-process on the shared tiny model (no browser)."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest
from sse_server import dead_url, start_in_thread

from kit import cli, metrics
from kit.errors import UserError
from kit.tour.check import judge_playground, playground_events, run_check
from kit.tour.context import TourContext
from kit.tour.generate import ModelCache, Timeline, check_request, endpoint_tokens, in_process_tokens, summary
from kit.tour.lessons import RUNNERS, lessons, run_lesson
from kit.tour.planned import parse_prices

PLANTED = "top_k_renorm_prob=kit.check.planted:top_k_renorm_prob_wrong_when_compiled"


@pytest.fixture(scope="module")
def ctx(tiny_model):
    c = TourContext()
    c.models.put("tiny-llama", "float32", "cpu", tiny_model)
    return c


def test_every_lesson_is_defined_with_a_control_an_expectation_and_a_function():
    ls = lessons()
    assert [x.id for x in ls] == ["playground", "prefill", "kv", "concurrency", "fit", "cost", "sanity"]
    for x in ls:
        assert x.text and x.expect and x.controls, x.id
        assert x.id == "playground" or x.id in RUNNERS
        json.dumps(x.as_dict(), allow_nan=False)  # what /api/lessons sends
    with pytest.raises(UserError, match="unknown lesson"):
        run_lesson(TourContext(), "nope", {})
    with pytest.raises(UserError, match="unknown setting"):
        run_lesson(TourContext(), "fit", {"colour": 1})


def test_in_process_stream_times_every_token_and_sums_up_in_metric_terms(ctx):
    events = []
    in_process_tokens(ctx.models.get("tiny-llama"), "hello tour", 6, threading.Event(), events.append)
    kinds = [e["type"] for e in events]
    assert kinds == ["start"] + ["token"] * 6 + ["summary"], kinds
    assert events[0]["prompt_tokens"] == len(b"hello tour")  # a preset: bytes in
    toks = [e for e in events if e["type"] == "token"]
    assert [t["n"] for t in toks] == list(range(1, 7)) and toks[0]["itl_ms"] is None
    assert all(t["itl_ms"] > 0 for t in toks[1:]) and all(t["text"].startswith(" t") for t in toks)
    t = [e["t_ms"] for e in toks]
    assert t == sorted(t) and toks[0]["ttft_ms"] == pytest.approx(t[0])
    s = events[-1]["summary"]
    assert s["output_tokens"] == 6 and s["itl_n"] == 5
    assert s["tpot_ms"] == pytest.approx((t[-1] - t[0]) / 5)  # kit.metrics.tpot_ms
    assert s["tok_s_per_stream"] == pytest.approx(metrics.tok_s_per_stream(s["tpot_ms"]))
    assert events[-1]["line"].startswith("TTFT ") and "6 output tokens" in events[-1]["line"]


def test_stop_ends_the_decode_loop_at_once(ctx):
    stop, events = threading.Event(), []

    def emit(e):
        events.append(e)
        if e["type"] == "token" and e["n"] == 3:
            stop.set()

    in_process_tokens(ctx.models.get("tiny-llama"), "stop me", 200, stop, emit)
    assert [e["type"] for e in events][-2:] == ["summary", "stopped"]
    assert events[-1]["tokens"] == 3 and sum(e["type"] == "token" for e in events) == 3


def test_bad_input_is_a_clear_message(ctx):
    with pytest.raises(UserError, match="prompt is empty"):
        check_request("   ", 8)
    with pytest.raises(UserError, match="max_tokens"):
        check_request("hi", 0)
    with pytest.raises(UserError, match=r"100,000 tokens.*at most 16,384"):  # a 100k-token prompt to a small model
        in_process_tokens(ctx.models.get("tiny-llama"), "x" * 100_000, 8, threading.Event(), lambda e: None)
    with pytest.raises(UserError, match="unknown model preset 'no-such-model'"):
        ModelCache().get("no-such-model")
    with pytest.raises(UserError, match="in-process model 'kimi-k2' .* does not fit here"):  # ~4 TB in fp32: refused
        ModelCache().get("kimi-k2")  # before any byte is allocated
    line, problems = judge_playground([{"type": "error", "message": "boom"}])
    assert problems == ["boom"]
    assert judge_playground([{"type": "start"}])[1] == ["no tokens arrived"]


@pytest.fixture(scope="module")
def scripted():
    """The scripted SSE server of the tests (tests/sse_server.py): errors and stalls on request."""
    srv = start_in_thread()
    yield srv.url
    srv.stop()


def test_endpoint_stream_against_the_scripted_server_errors_and_stalls(scripted):
    url = scripted

    def run(model, **kw):
        async def go():
            return [e async for e in endpoint_tokens(url, model, "a b c", 4, asyncio.Event(), **kw)]

        return asyncio.run(go())

    ok = run("normal")
    assert [e["type"] for e in ok] == ["start"] + ["token"] * 4 + ["summary"]
    assert ok[-1]["summary"]["output_tokens"] == 4
    err = run("e6")  # an error event mid-stream, after one token
    assert err[-1]["type"] == "error" and "engine overloaded" in err[-1]["message"]
    stall = run("stall", stall_s=0.5)  # one chunk, then silence
    assert stall[-1]["type"] == "error" and "stalled: no data for 0.5 s after 1 token;" in stall[-1]["message"]

    async def unreachable():
        return [e async for e in endpoint_tokens(dead_url(), "m", "hi", 4, asyncio.Event())]

    bad = asyncio.run(unreachable())
    assert bad[-1]["type"] == "error" and "cannot connect" in bad[-1]["message"]


def test_lessons_give_finite_numbers_from_the_kit(ctx):
    pre = run_lesson(ctx, "prefill", {"prompt_len": 64})
    assert pre["ok"] and [p[0] for p in pre["chart"]["series"][0]["points"]] == [8, 16, 32, 64]
    assert all(math.isfinite(v) and v > 0 for row in pre["table"]["rows"] for v in row)
    kv = run_lesson(ctx, "kv", {"context": 128})
    assert kv["ok"] and all(p[1] > 0 for s in kv["chart"]["series"] for p in s["points"])
    conc = run_lesson(ctx, "concurrency", {"users": 4, "context": 32})
    rows = conc["table"]["rows"]
    assert conc["ok"] and [r[0] for r in rows] == [1, 2, 4]
    assert rows[-1][3] > rows[0][3]  # total tok/s rises with users on a 4.9M-param model
    for r in rows:  # per-user and total from kit.metrics
        assert r[2] == pytest.approx(metrics.tok_s_per_stream(r[1])) and r[3] == pytest.approx(r[0] * r[2])


def test_planner_lessons_fit_and_cost():
    c = TourContext()
    fit = run_lesson(c, "fit", {"model": "llama-3.1-8b", "accelerator": "H100", "context": 4096, "users": 8})
    assert fit["ok"] and fit["fits"] and fit["chart"]["bars"][0]["parts"]["weights"] == pytest.approx(16.06, rel=0.01)
    big = run_lesson(c, "fit", {"model": "llama-3.1-405b", "accelerator": "H100", "context": 4096, "users": 8})
    assert not big["fits"] and "DOES NOT FIT" in big["line"]
    cost = run_lesson(
        c, "cost", {"model": "llama-3.1-8b", "n_gpus": 1, "prices": "B300=1000", "accelerators": "b300,B200"}
    )
    table = {r[0]: r for r in cost["table"]["rows"]}
    assert sorted(table) == ["B200", "B300"]
    assert cost["ok"] and table["B300"][1] == 1000 and table["B300"][4] == "yours" and table["B200"][4] == "tco"
    for acc, price, tok_s_gpu, usd, _basis, _note in table.values():  # $/Mtok = kit.metrics.usd_per_mtok
        assert usd == pytest.approx(metrics.usd_per_mtok(tok_s_gpu, price, 1)), acc
    assert table["B200"][1] == pytest.approx(1.95) and cost["line"].startswith("at 50 tok/s per user")
    assert parse_prices("mi355x=2, B300=5.5") == {"MI355X": 2.0, "B300": 5.5}
    for bad, msg in (("B300", "NAME=\\$/GPU-hour"), ("Z9=1", "unknown accelerator"), ("B300=-1", "price > 0")):
        with pytest.raises(UserError, match=msg):
            parse_prices(bad)


def test_check_names_the_failed_lesson_for_a_planted_op_and_a_server_error(ctx, scripted, capsys, monkeypatch):
    from kit.qualification.items_check import op_impls

    planted = TourContext(models=ctx.models, op_impls=op_impls([PLANTED]), compile_backend="eager")
    # the CLI, end to end: exit 1 naming the lesson; every other lesson still ran
    monkeypatch.setattr("kit.tour.cli._context", lambda args: planted)
    rc = cli.main(["tour", "--check", "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert rc == 1 and doc["failed"] == ["sanity"] and len(doc["lessons"]) == 7
    assert "FAILED lesson 'Is the stack sane' (sanity)" in err and "float32 compile" in err
    assert doc["lessons"][-1]["line"].endswith("float32 eager PASS, float32 compile FAIL")
    assert all(o["ok"] for o in doc["lessons"][:-1])
    ev = playground_events(ctx, 4, scripted, served_model="e6")  # a server erroring mid-stream
    assert judge_playground(ev)[1] and "engine overloaded" in judge_playground(ev)[1][0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--json"], "--json goes with --check"),
        (["--check", "--url", "localhost:8000"], "--url 'localhost:8000': give an http:// or https:// URL"),
        (["--check", "--model", "no-such"], "--model 'no-such': not a preset"),
        (["--check", "--dtype", "int8"], "--dtype: dtype 'int8'"),
        (["--check", "--device", "warp"], "--device 'warp'"),
        (["--check", "--op-impl", "top_k_renorm_prob=no_such_module:f"], "module 'no_such_module' does not import"),
    ],
)
def test_bad_options_are_user_errors_before_any_work(argv, says, capsys):
    assert cli.main(["tour", *argv]) == 2
    assert says in capsys.readouterr().err


def test_timeline_matches_request_timings_for_multi_token_chunks():
    tl = Timeline(0.0)
    tl.add("a", 0.1, 1)
    tl.add("bcd", 0.4, 3)
    s = summary(tl)
    rt = metrics.request_timings([0.1, 0.4], [1, 3], 4, 0.0)
    assert s["tpot_ms"] == pytest.approx(rt.tpot_ms) and s["itl_n"] == len(rt.itl_ms) == 3


def test_context_sliders_end_at_the_limit_the_measurement_checks(ctx):
    from kit.measure.engine import PointConfig
    from kit.models import get_config, max_positions
    from kit.tour.measured import longest_context, point

    top = longest_context("tiny-llama")
    assert top == 16376  # 16,384 positions less the 8 decode steps after the context
    kv = next(x for x in lessons("tiny-llama") if x.id == "kv")
    assert next(c for c in kv.controls if c.name == "context").max == top
    positions = max_positions(get_config("tiny-llama"))
    point(1, top).validate(positions)  # the slider's last step is measurable ...
    with pytest.raises(UserError, match="use context_len <= 16376"):
        PointConfig(1, top + 1, 8, 2, 3, "synthetic").validate(positions)
    with pytest.raises(UserError, match=r"context=16384: at most 16376 tokens on tiny-llama"):  # ... one more is not
        run_lesson(ctx, "kv", {"context": 16384})


def test_lessons_report_medians_with_n_and_the_kits_noise_verdict(ctx, monkeypatch):
    from kit.tour.measured import REPEATS, noise

    pre = run_lesson(ctx, "prefill", {"prompt_len": 16})
    assert pre["numbers"]["samples"] == f"medians of {REPEATS} prefills, {REPEATS * 8} decode steps per point"
    # the sweep's own verdict on the same records: a step 3.3x the fastest is a noisy machine
    recs = [
        {"status": "ok", "tpot_ms_p50": 3.3, "tpot_ms_min": 1.0},
        {"status": "ok", "tpot_ms_p50": 1, "tpot_ms_min": 1},
    ]
    assert noise(recs).startswith("noisy machine: TPOT p50 is up to 3.3x the fastest step")
    assert noise(recs[1:]) is None
    said = "noisy machine: TPOT p50 is up to 9.9x the fastest step of its point"
    monkeypatch.setattr("kit.measure.sweep.noise_warning", lambda df: said)
    kv = run_lesson(ctx, "kv", {"context": 32})
    assert kv["noise"] == said and kv["numbers"]["noise"] == said
    assert "noise" in next(x for x in lessons() if x.id == "kv").expect
    kv_check = next(o for o in run_check(ctx) if o.lesson == "kv")  # --check says it beside the numbers too
    assert kv_check.ok and kv_check.line.endswith(f"[{said}]")


def test_one_token_summary_says_na_and_why():
    tl = Timeline(0.0)
    tl.add("a", 0.1, 1)
    s = summary(tl)
    assert s["itl_ms_p50"] is None and s["tpot_ms"] is None and s["tok_s_per_stream"] is None
    assert "TPOT n/a (1 token)" in s["line"] and "ITL p50 n/a (1 token)" in s["line"]
    json.dumps(s, allow_nan=False)


def test_check_stall_names_its_own_option(ctx, scripted, capsys):
    ev = playground_events(ctx, 4, scripted, served_model="stall", stall_s=0.5)
    assert "raise --stall-timeout for a slow server" in ev[-1]["message"]
    with pytest.raises(SystemExit) as out:  # argparse's own refusal: exit 2
        cli.main(["tour", "--check", "--stall-timeout", "0"])
    assert out.value.code == 2
    assert "--stall-timeout" in capsys.readouterr().err


def test_the_free_cores_line_never_counts_a_busy_core_as_free(monkeypatch):
    import psutil

    from kit import hardware
    from kit.track.noise import busy_cores

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval, percpu: [100.0, 100.0])
    n, why, busy = hardware.cpu_threads_for_timing(0.0)
    assert n == 1 and why == "no core of 2 free at the start (2.0 cores busy with other work): 1 thread"
    assert busy_cores(why) == 2.0  # kit track still reads the load
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval, percpu: [95.0, 3.0])
    assert hardware.cpu_threads_for_timing(0.0)[1] == "1 of 2 cores free at the start (1.0 cores busy with other work)"
