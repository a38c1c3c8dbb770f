"""The docs build (Sphinx + MyST-NB, ``-nW``: warnings are errors) from the notebooks the doc tests executed.

No notebook is executed twice: ``nbexec`` runs each once per session (shared with ``test_notebooks_docs.py``) and
the build renders those executed copies with MyST-NB's execution off. A notebook that fails to execute fails
here too (its ``execute`` re-raises).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
from nbexec import EXEC_DIR, SMALL, execute, start_all

pytestmark = pytest.mark.slow
DOCS = Path(__file__).resolve().parents[2] / "docs"


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
