"""``kit tour`` against a real engine: the playground in headless Chromium streaming from vLLM on this CPU (the
tier's ``main`` server, :mod:`engine_server`), Stop closing the stream mid-way, and ``kit tour --check --url``'s
playground lesson green against it. Skips like the rest of the tier when it is absent. Screenshots:
``test-artifacts/tour-vllm-*.png``."""

import asyncio

import pytest
from tour_page import CHROMIUM, live_state, need_browser, stream_twice_then_finish

from kit.tour.check import judge_playground, playground_events
from kit.tour.context import TourContext
from kit.tour.generate import endpoint_tokens
from kit.tour.server import TourServer

pytestmark = pytest.mark.slow


def test_tour_playground_streams_from_vllm_and_stops(vllm_main, tmp_path):
    need_browser()
    from playwright.sync_api import sync_playwright

    url = vllm_main["url"]
    line, problems = judge_playground(playground_events(TourContext(), 8, url))  # kit tour --check --url's lesson
    assert not problems and line.startswith("TTFT ")
    with TourServer(url=url, out_dir=tmp_path) as tour, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1250, "height": 900})
            page.goto(tour.page_url, timeout=60_000)
            page.wait_for_selector("#pg-send", timeout=60_000)
            first, second, after = stream_twice_then_finish(page, "tour-vllm", "Once upon a time", "url", 1000, url=url)
            assert first["spans"] < second["spans"] <= after["spans"] and first["points"] < second["points"]
            assert not first["summary"]  # read mid-stream (vLLM may finish 1000 tokens before a screenshot is taken)
            assert after["summary"].startswith("TTFT ") and not after["error"], after
            assert tour.status()["generations"] == 0 and not live_state(page)["error"]
        finally:
            browser.close()
    # Stop against the real server: the stream is closed mid-way and ends with what arrived
    stop = asyncio.Event()

    async def stopped_after_five():
        out = []
        async for ev in endpoint_tokens(url, None, "A long one, stopped", 900, stop):
            out.append(ev)
            if ev["type"] == "token" and ev["n"] >= 5:
                stop.set()
        return out

    events = asyncio.run(stopped_after_five())
    assert [e["type"] for e in events][-2:] == ["summary", "stopped"], events[-3:]
    assert 5 <= events[-1]["tokens"] < 900
