"""End to end: ``kit tour``'s page in headless Chromium, against the in-process tiny model and against the kit's
simulated server (a real HTTP server): tokens stream in (two distinct states mid-stream, the ITL chart gaining
points), Stop, the summary line, bad input said on the page, every lesson stepped through, and requests without
the token, from another Host or from another Origin refused. Screenshots: ``test-artifacts/tour-*.png``."""

from __future__ import annotations

import json

import pytest
from tour_page import http, live_state, need_browser, send, shot, stream_twice_then_finish, wait_done, wait_tokens

from kit.tour.context import TourContext
from kit.tour.lessons import lessons
from kit.tour.server import TourServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tour(tiny_model, tmp_path_factory):
    ctx = TourContext(compile_backend="eager")  # dynamo tracing only: the compiled path, without inductor's cost
    ctx.models.put("tiny-llama", "float32", "cpu", tiny_model)
    quick = {x.id: x.check for x in lessons()}  # each lesson starts at its small --check settings
    with TourServer(ctx=ctx, out_dir=tmp_path_factory.mktemp("tour"), lesson_defaults=quick) as srv:
        yield srv


@pytest.fixture(scope="module")
def page(tour):
    need_browser()
    from playwright.sync_api import sync_playwright
    from tour_page import CHROMIUM

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1250, "height": 900})
        pg.goto(tour.page_url, timeout=60_000)
        pg.wait_for_selector("#nav button[data-lesson=sanity]", timeout=60_000)
        yield pg
        browser.close()


def _status(page, tour) -> dict:
    return page.evaluate("async () => (await fetch('/api/status')).json()")


def test_requests_without_the_token_or_from_elsewhere_are_refused(tour):
    assert http(tour.url + "/") == 403  # no token
    assert http(tour.url + "/api/lessons") == 403
    assert http(tour.url + "/?token=wrong") == 403
    assert http(tour.page_url) == 200
    assert http(tour.page_url, {"Host": "evil.example"}) == 403  # DNS rebinding: another name for 127.0.0.1
    cookie = {"Cookie": f"{tour.cookie}={tour.token}", "Content-Type": "application/json"}
    assert http(tour.url + "/api/lessons", cookie) == 200
    body = json.dumps({"id": 1}).encode()
    assert http(tour.url + "/api/stop", {**cookie, "Origin": "http://evil.example"}, body) == 403
    assert http(tour.url + "/api/stop", {**cookie, "Origin": tour.url}, body) == 200


def test_playground_streams_the_in_process_model_live_and_stops(page, tour):
    page.click("#nav button[data-lesson=playground]")
    # a long generation: two states mid-stream, then Stop
    send(page, "Explain the KV cache.", "in-process", 3000, model="tiny-llama")
    a = wait_tokens(page, 4)
    shot(page, "tour-inprocess-mid1")
    b = wait_tokens(page, a["spans"] + 10)
    shot(page, "tour-inprocess-mid2")
    assert b["spans"] > a["spans"] and b["points"] > a["points"] >= 3 and b["circles"] > a["circles"]
    assert a["ttft"].endswith("ms") and b["toks"].endswith("tok/s") and not a["summary"] and not b["summary"]
    page.click("#pg-stop")
    stopped = wait_done(page, 30_000)
    assert stopped["status"].startswith("stopped after") and stopped["summary"].startswith("TTFT ")
    status = _status(page, tour)
    assert int(stopped["n"]) < 3000 and status["generations"] == 0 and status["torch_tasks"] == 0
    # a short one that runs to its end: the summary in the kit's terms
    send(page, "Write a haiku about memory bandwidth.", "in-process", 24)
    done = wait_done(page)
    shot(page, "tour-inprocess-after")
    assert done["spans"] == 24 and done["n"] == "24" and done["points"] == 23
    assert "TPOT" in done["summary"] and "24 output tokens" in done["summary"] and not done["error"]


@pytest.fixture(scope="module")
def scripted():
    """The scripted SSE server of the tests (tests/sse_server.py): errors and stalls on request."""
    from sse_server import start_in_thread

    srv = start_in_thread()
    yield srv.url
    srv.stop()


def test_bad_input_is_said_on_the_page_and_it_stays_usable(page, tour, scripted):
    from sse_server import dead_url

    page.click("#nav button[data-lesson=playground]")
    for prompt, source, fields, says in (
        ("", "in-process", {}, "prompt is empty"),
        ("x" * 100_000, "in-process", {}, "at most 16,384"),
        ("hi", "in-process", {"model": "no-such-model"}, "unknown model preset 'no-such-model'"),
        ("hi", "url", {"url": dead_url(), "served": ""}, "is a server running there?"),
        ("hi", "url", {"url": scripted, "served": "stall", "stall": 1}, "stalled: no data for 1 s after 1 token;"),
        ("hi", "url", {"url": scripted, "served": "e6"}, "error event mid-stream"),
        ("hi", "launch", {"model": "tiny-llama"}, "not a local checkpoint directory"),
    ):
        send(page, prompt, source, 8, **fields)
        state = wait_done(page, 30_000)
        assert says in state["error"], (says, str(state))
        if "stalled" in says:
            shot(page, "tour-stall")  # the message, and the token that came before the silence
    shot(page, "tour-bad-input")
    page.fill("#pg-stall", "30")
    send(page, "still usable?", "in-process", 5, model="tiny-llama")
    assert wait_done(page)["spans"] == 5 and not live_state(page)["error"]


def test_playground_streams_from_the_kits_simulated_server(page, tour):
    page.click("#nav button[data-lesson=playground]")
    first, second, after = stream_twice_then_finish(page, "tour-sim", "The simulated server, please.", "sim", 40)
    assert first["spans"] < second["spans"] < after["spans"] == 40
    assert first["points"] < second["points"] < after["points"] == 39 and not second["summary"]
    assert after["summary"].startswith("TTFT ") and "40 output tokens" in after["summary"]
    tpot = float(after["summary"].split("TPOT ")[1].split(" ms")[0])
    assert 20 < tpot < 60  # the simulated server's 25 ms per token, measured through the page
    assert _status(page, tour)["generations"] == 0


def test_every_lesson_steps_through_with_numbers_from_the_kit(page, tour):
    page.click("#nav button[data-lesson=prefill]")
    page.click("#prev")
    assert page.inner_text("#lesson-title") == "Playground" and page.is_disabled("#prev")
    seen = []
    for i, lesson in enumerate(lessons()):
        assert page.inner_text("#progress") == f"Lesson {i + 1} of 7"
        assert page.inner_text("#lesson-title") == lesson.title
        if lesson.id != "playground":
            page.wait_for_function(
                "() => document.querySelector('#result-line').innerText.length > 0"
                " || !document.querySelector('#error').hidden",
                timeout=60_000,
            )
            assert page.is_hidden("#error"), page.inner_text("#error")
            line = page.inner_text("#result-line")
            assert line and "n/a" not in line, line
            seen.append(line)
            drawn = page.evaluate("() => document.querySelectorAll('#chart polyline, #chart rect, #table td').length")
            assert drawn > 0
        shot(page, f"tour-lesson-{i + 1}-{lesson.id}", full_page=lesson.id in ("fit", "cost"))
        if i < 6:
            page.click("#next")
    assert page.is_disabled("#next") and "PASS" in seen[-1] and "FITS" in seen[3] and "cheapest" in seen[4]


SLEEPER = "import time; time.sleep(600)"  # a launched engine that never becomes ready


def test_stop_before_the_first_token_says_stopped_and_one_token_says_why(page, tour, tmp_path):
    import sys

    page.click("#nav button[data-lesson=playground]")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    before = _status(page, tour)["servers"]  # the simulated server of an earlier test, if any
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("kit.serve.launch.build_command", lambda spec: ([sys.executable, "-c", SLEEPER], {}))
        page.select_option("#pg-source", "launch")  # the server field shows for a launch only
        page.select_option("#pg-server", "transformers")
        send(page, "hi", "launch", 4, model=str(ckpt))
        page.wait_for_function("() => document.querySelector('#pg-status').innerText.startsWith('starting')")
        page.click("#pg-stop")
        state = wait_done(page, 15_000)
    shot(page, "tour-stopped-launch")
    assert state["status"].startswith("stopped") and not state["error"], state
    assert _status(page, tour)["servers"] == before  # the cancelled launch left no server
    send(page, "hi there", "in-process", 1, model="tiny-llama")  # one token: no gap to time, said so
    done = wait_done(page)
    assert not done["error"] and "TPOT n/a (1 token)" in done["summary"] and "1 output token ·" in done["summary"]


def test_chart_ticks_are_round_unclipped_and_whole_for_counts(page, tour):
    page.click("#nav button[data-lesson=playground]")
    send(page, "count the ticks", "in-process", 40, model="tiny-llama")
    wait_done(page)
    # the strip's x-axis: token numbers, whole (the labels on the axis line: y = height - 36 + 14)
    xs = page.evaluate(
        """() => [...document.querySelectorAll('#itl-chart text')]
            .filter((t) => Number(t.getAttribute('y')) === 160 - 36 + 14).map((t) => t.textContent)"""
    )
    assert len(xs) >= 3 and all(t.isdigit() for t in xs), xs
    page.click("#nav button[data-lesson=kv]")
    drawn = page.evaluate(
        """() => {
        const svg = document.getElementById('chart');
        const W = Number(svg.getAttribute('width'));
        drawChart(svg, {kind: 'line', x: 'context', y: 'TPOT ms', series: [{name: 'a', points:
            [[256, 3], [512, 250], [1024, 600], [2048, 1032]]}]});
        const texts = [...svg.querySelectorAll('text')];
        return {labels: texts.map((t) => t.textContent),
                clipped: texts.filter((t) => { const b = t.getBBox(); return b.x < 0 || b.x + b.width > W; })
                              .map((t) => t.textContent)};
    }"""
    )
    labels = drawn["labels"]
    assert not drawn["clipped"] and not any("e+" in t for t in labels), drawn
    assert {"256", "512", "1,024", "2,048"} <= set(labels) and {"0", "200", "1k", "1,200"} <= set(labels), labels
    assert page.evaluate("() => document.querySelector('link[rel=icon]') !== null")  # no favicon request, no 404
