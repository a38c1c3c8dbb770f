"""``kit history report``'s page in headless Chromium (Debian's /usr/bin/chromium via Playwright's
``executable_path``): the tok/s-per-dollar plot is drawn and visible, the compare table marks the regression.
The screenshot is saved as ``test-artifacts/history-report.png``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from simulated_runs import simulated_history

from kit.track.db import Provenance, add_run
from kit.track.report import write_report

pytestmark = pytest.mark.slow
CHROMIUM = os.environ.get("KIT_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def test_history_report_in_headless_chromium(tmp_path):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"browser test needs {CHROMIUM}: .ci/setup.sh installs it")
        pytest.skip(f"missing {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    db = tmp_path / "h.duckdb"
    for commit, run in simulated_history(tmp_path / "runs", commits=6, slow_at=6):
        add_run(db, run, Provenance(commit, "main", False))
    page_path = write_report(db, tmp_path / "report")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1250, "height": 1600})
            page.goto(page_path.resolve().as_uri())
            plot = page.locator("img#plot-tok_s_per_usd")
            assert plot.is_visible()
            assert page.evaluate("() => document.querySelector('#plot-tok_s_per_usd').naturalWidth") > 300
            box = plot.bounding_box()
            assert box["width"] > 300 and box["height"] > 100
            rows = page.locator("table.kit-compare tbody tr")
            assert rows.count() == 16  # 4 points x 4 metrics, c05 -> c06
            assert page.locator("table.kit-compare td.regression").count() >= 2
            assert page.locator("table.kit-provenance tbody tr").count() == 6
            page.screenshot(path=str(ARTIFACTS / "history-report.png"), full_page=True)
        finally:
            browser.close()
