"""Driving ``kit tour``'s page in headless Chromium (Playwright, Debian's /usr/bin/chromium through
``executable_path``; ``playwright install`` is never run): the helpers the tour's browser tests share
(tests/tour/test_tour_browser.py, tests/engine/test_tour_vllm.py; the dashboard's browser test takes
Chromium's path, the artifacts folder and the skip rule from here too). Screenshots go to ``test-artifacts/``."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("KIT_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def need_browser() -> None:
    """Skip (fail under CI) when Chromium or Playwright is missing."""
    missing = [CHROMIUM] if not Path(CHROMIUM).exists() else []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip)")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"browser test needs {missing}: .ci/setup.sh installs them")
        pytest.skip(f"missing {missing} (bash .ci/setup.sh installs them)")


def http(url: str, headers: dict | None = None, data: bytes | None = None) -> int:
    """The HTTP status of a GET (or a POST with ``data``) to ``url`` with ``headers``."""
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def shot(page, name: str, full_page: bool = False) -> Path:
    """A screenshot of the viewport (or the whole page) as ``test-artifacts/<name>.png``."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def live_state(page) -> dict:
    """What the playground shows now: tokens (spans), ITL chart points, the counters, the summary and the error."""
    return page.evaluate(
        """() => ({
            spans: document.querySelectorAll('#pg-tokens span.tok').length,
            points: Number(document.querySelector('#itl-chart').dataset.points),
            circles: document.querySelectorAll('#itl-chart circle.pt').length,
            n: document.querySelector('#pg-n').innerText,
            ttft: document.querySelector('#pg-ttft').innerText,
            toks: document.querySelector('#pg-toks').innerText,
            summary: document.querySelector('#pg-summary').innerText,
            error: document.querySelector('#error').hidden ? '' : document.querySelector('#error').innerText,
            status: document.querySelector('#pg-status').innerText,
        })"""
    )


def send(page, prompt: str, source: str, max_tokens: int, **fields) -> None:
    """Fill the playground (prompt, source, max tokens, and any of url/model) and press Send."""
    page.select_option("#pg-source", source)
    for name, value in fields.items():
        page.fill(f"#pg-{name}", str(value))
    page.fill("#pg-prompt", prompt)
    page.fill("#pg-max", str(max_tokens))
    page.click("#pg-send")


def wait_tokens(page, n: int, timeout_ms: int = 60_000) -> dict:
    """Wait until at least ``n`` tokens are on the page; returns :func:`live_state`."""
    page.wait_for_function(f"() => document.querySelectorAll('#pg-tokens span.tok').length >= {n}", timeout=timeout_ms)
    return live_state(page)


def wait_done(page, timeout_ms: int = 60_000) -> dict:
    """Wait until Send is enabled again (the stream ended); returns :func:`live_state`."""
    page.wait_for_function("() => !document.querySelector('#pg-send').disabled", timeout=timeout_ms)
    return live_state(page)


def stream_twice_then_finish(page, name: str, prompt: str, source: str, max_tokens: int, **fields) -> list[dict]:
    """Send, capture two distinct states mid-stream (screenshots ``<name>-mid1``, ``<name>-mid2``), let it end
    (``<name>-after``); returns the three states."""
    send(page, prompt, source, max_tokens, **fields)
    first = wait_tokens(page, 3)
    shot(page, f"{name}-mid1")
    second = wait_tokens(page, first["spans"] + 3)
    shot(page, f"{name}-mid2")
    page.wait_for_function("() => document.querySelector('#pg-summary').innerText.length > 0", timeout=60_000)
    after = wait_done(page)
    shot(page, f"{name}-after")
    return [first, second, after]
