"""Doc test of how-to/track-performance-per-commit: three commits added to a real DuckDB history, the slowed
third flagged by the compare, the HTML report written (the page itself is tested in Chromium in tests/track)."""

from __future__ import annotations

import json

import pytest
from nbexec import execute

from kit.track.db import list_runs, load_rows

pytestmark = pytest.mark.slow


def test_howto_track_performance_per_commit():
    out = execute("how-to/track-performance-per-commit.ipynb").out_dir
    runs = list_runs(out / "history.duckdb")
    assert list(runs.commit) == ["commit-1", "commit-2", "commit-3-slow"]
    assert set(runs.replicates) == {2} and set(runs.price_basis) == {"user"}
    rows = load_rows(out / "history.duckdb")
    assert len(rows) == 3 * 2 * 4 and rows.ok.all()
    slow = json.loads(rows[rows.commit == "commit-3-slow"].row_json.iloc[0])
    assert slow["x_injected_delay_ms"] == 20.0 and "x_injected_delay_ms" not in json.loads(rows.row_json.iloc[0])
    s = json.loads((out / "summary.json").read_text())
    if s["slow_exit"] == 3:  # the gate refuses to call it on a machine the suite's own workers load: it says why
        assert any(w in s["slow_inconclusive"] for w in ("busy", "noise", "thread")), s
    else:
        assert s["slow_exit"] == 1 and s["slow_points"], s  # 20 ms a step on ~1-3 ms steps
    page = (out / "report" / "index.html").read_text()
    assert 'id="plot-tok_s_per_usd"' in page and "kit-compare" in page and "kit-provenance" in page
    assert (out / "report" / "history_tok_s_per_usd.png").read_bytes()[:4] == b"\x89PNG"
