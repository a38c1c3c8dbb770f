"""End to end: ``kit dashboard``'s page (Voilà) driven in headless Chromium with Playwright.

Uses Debian's ``/usr/bin/chromium`` through ``executable_path`` (``playwright install`` downloads browsers and is
never run). ``.ci/setup.sh`` installs chromium; outside CI the test is skipped when it is missing. The screenshot
is saved as ``test-artifacts/dashboard.png``.
"""

from __future__ import annotations

import pytest
from tour_page import ARTIFACTS, CHROMIUM, need_browser

from kit.store import load_results
from kit.view.dashboard import launch

pytestmark = pytest.mark.slow


def test_dashboard_in_headless_chromium(tmp_path):
    need_browser()
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    out = tmp_path / "dash"
    srv = launch(
        out_dir=out,
        port=0,
        log_path=tmp_path / "voila.log",
        kv_lens=[128],
        concurrencies=[8],
        decode_steps=8,
        repeats=2,
        device="cpu",
    )
    url = srv.page_url  # http://127.0.0.1:PORT/?token=...
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1300, "height": 1250})
                denied = page.goto(srv.url + "/", timeout=120_000)  # without the token: refused
                assert denied.status == 403
                page.goto(url, timeout=120_000)
                page.wait_for_selector(".kit-run", timeout=120_000)  # Voilà ran the notebook; widgets are live
                # enter a tiny 2 x 2 sweep
                page.fill(".kit-kv input", "16, 32")
                page.fill(".kit-concurrency input", "1, 2")
                for cls, val in ((".kit-decode-steps", "4"), (".kit-repeats", "1"), (".kit-warmup-steps", "1")):
                    page.fill(f"{cls} input", val)
                    page.press(f"{cls} input", "Enter")
                page.click(".kit-run")
                rows = page.locator(".kit-table table.kit-results tbody tr")
                page.wait_for_function(
                    "() => document.querySelectorAll('.kit-table table.kit-results tbody tr').length === 4",
                    timeout=180_000,
                )
                page.wait_for_function(
                    "() => (document.querySelector('.kit-status') || {}).innerText?.includes('done')", timeout=60_000
                )
                img = page.locator("img.kit-plot")
                page.wait_for_function(
                    "() => { const i = document.querySelector('img.kit-plot');"
                    " return i && i.complete && i.naturalWidth > 100; }",
                    timeout=60_000,
                )
                assert img.is_visible()
                assert rows.count() == 4
                cells = page.locator(".kit-table table.kit-results tbody tr td").all_inner_texts()
                assert cells.count("ok") == 4
                page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            finally:
                browser.close()
    finally:
        srv.stop()
    assert srv.proc.poll() is not None  # the launcher stopped Voilà's whole process group
    for f in out.rglob("*"):  # the token reached no file: log, notebook, results
        if f.is_file():
            assert srv.token not in f.read_bytes().decode("utf-8", "replace"), f
    runs = list(out.glob("run-*"))
    assert len(runs) == 1
    df = load_results(runs[0])
    assert sorted(zip(df.context_len, df.concurrency)) == [(16, 1), (16, 2), (32, 1), (32, 2)]
    assert set(df.decode_steps) == {4} and set(df.status) == {"ok"}


def test_launch_on_a_busy_port_fails_with_voilas_log(tmp_path):
    """Voilà on a port already taken exits at once (no port retries): the one launcher reports it with the log."""
    import socket

    from kit.errors import ServerError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerError, match="exited") as ei:
            launch(out_dir=tmp_path / "d", port=port, timeout_s=60, device="cpu")
    assert str(port) in str(ei.value) and (tmp_path / "d" / "voila.log").exists()
