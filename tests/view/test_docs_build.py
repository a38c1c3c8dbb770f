"""The docs build (Sphinx + MyST-NB, ``-nW``: warnings are errors) from the notebooks the doc tests executed, then
the built site looked at in headless Chromium.

No notebook is executed twice: ``nbexec`` runs each once per session (shared with ``test_notebooks_docs.py``) and
the build renders those executed copies with MyST-NB's execution off. A notebook that fails to execute fails
here too (its ``execute`` re-raises). The browser is Debian's ``/usr/bin/chromium`` through Playwright's
``executable_path`` (as in ``test_dashboard_browser.py``); without it the browser part is skipped locally and fails
in CI. Screenshots: ``test-artifacts/docs-*.png``.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest
from nbexec import EXEC_DIR, SMALL, execute, start_all

pytestmark = pytest.mark.slow
DOCS = Path(__file__).resolve().parents[2] / "docs"
CHROMIUM = os.environ.get("KIT_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CAPTIONS = ["Tutorials", "How-to guides", "Reference", "Explanation"]


def _build_module():
    spec = importlib.util.spec_from_file_location("kit_docs_build", DOCS / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_docs_build_nitpicky_warnings_as_errors(tmp_path):
    start_all()
    for rel in SMALL:
        execute(rel)  # raises the notebook's execution error: a broken notebook fails the docs
    build = _build_module()
    t0 = time.perf_counter()
    rc = build.build(out=tmp_path / "docs", executed=EXEC_DIR / "notebooks", execute=False)
    print(f"sphinx build: {time.perf_counter() - t0:.1f} s")
    assert rc == 0, "sphinx-build -nW failed: see the warnings above"
    html = tmp_path / "docs" / "html"
    index = (html / "index.html").read_text()
    for section in ("Tutorials", "How-to guides", "Reference", "Explanation"):
        assert section in index
    for rel in SMALL:
        page = html / "notebooks" / rel.replace(".ipynb", ".html")
        text = page.read_text()
        assert "cell_output" in text, f"{rel} rendered without outputs"
    api = (html / "api.html").read_text()
    for name in (
        "kit.view.panel.ControlPanel",
        "kit.measure.sweep.run_sweep",
        "kit.metrics.usd_per_mtok",
        "kit.results.schema_table",
        "kit.view.compare_view.CompareView",
        "kit.view.plots.knee_plot",
        "kit.serve.launch.Server",
        "kit.plan.cost",
        "kit.check.sampling",
        "kit.grid.run_grid",
        "kit.errors.UserError",
        "kit.dtypes.canonical",
    ):
        assert name in api, name
    assert 'id="module-kit._io"' not in api  # private: no section of its own
    for mod in build.api_modules():  # every public module of every subpackage has its section
        assert f'id="module-{mod}"' in api, mod
    arch = (html / "architecture.html").read_text()
    assert "architecture.html" in index and "<h1>" in arch
    _look_in_chromium(html, notebook="notebooks/" + next(iter(SMALL)).replace(".ipynb", ".html"))


def _look_in_chromium(html: Path, notebook: str) -> None:
    """The built site as a reader sees it (1280 x 1000 window): the theme's layout is in force (the sidebar beside
    the article), the sidebar lists every page of the index under its four captions, the header's title is clear of
    the search button, and no page is wider than the window (wide code and tables scroll inside their own boxes).
    ``notebook``: a page (relative to ``html``) of a notebook with outputs, whose code is highlighted."""
    missing = [m for m in (CHROMIUM,) if not Path(m).exists()]
    if importlib.util.find_spec("playwright") is None:
        missing.append("playwright (pip)")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the docs' browser check needs {missing}: .ci/setup.sh installs them")
        pytest.skip(f"docs built and checked; browser check skipped: missing {missing}")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            for name, rel in (("index", "index.html"), ("architecture", "architecture.html"), ("notebook", notebook)):
                page.goto((html / rel).resolve().as_uri())
                nav, article = page.locator("nav.bd-docs-nav"), page.locator("article.bd-article")
                assert nav.is_visible() and article.is_visible(), rel
                assert nav.bounding_box()["x"] + nav.bounding_box()["width"] <= article.bounding_box()["x"], rel
                assert nav.locator("p.caption").all_inner_texts() == CAPTIONS, rel
                title = page.locator(".bd-header .navbar-brand").bounding_box()
                search = page.locator(".bd-header .navbar-header-items__end .search-button-field").bounding_box()
                assert title["x"] + title["width"] <= search["x"], f"{rel}: the title runs under the search button"
                wide = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
                assert wide <= 0, f"{rel} is {wide} px wider than the window"
                page.screenshot(path=str(ARTIFACTS / f"docs-{name}.png"))
                if rel == "index.html":  # the sidebar holds exactly the pages of the index's toctrees
                    pages = page.eval_on_selector_all(
                        ".bd-article .toctree-wrapper a.internal", "a => a.map(x => x.href)"
                    )
                    listed = page.eval_on_selector_all("nav.bd-docs-nav a.internal", "a => a.map(x => x.href)")
                    assert len(pages) > 10 and sorted(listed) == sorted(pages)
            assert page.locator(".cell_input .highlight pre span").count() > 10  # highlighted code
            assert page.locator(".cell_output").first.is_visible()
            current = page.locator('nav.bd-docs-nav a[aria-current="page"]')  # the page read is marked in the sidebar
            assert current.count() == 1 and page.title().startswith(current.inner_text())
        finally:
            browser.close()
