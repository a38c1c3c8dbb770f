"""kit.view.render on hand-made frames: the panel's table, problem lines, PNG bytes and static snapshot."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from kit.view.render import (  # noqa: E402
    TABLE_COLUMNS,
    figure_png,
    point_problems,
    results_table,
    snapshot_html,
    table_html,
    widget_bundle,
)


def _rows():
    return pd.DataFrame(
        [
            {
                "dtype": "float32",
                "context_len": 64,
                "concurrency": 2,
                "status": "ok",
                "tpot_ms_p50": 1.23456,
                "error": None,
                "x_step_ms": [1.0],
            },
            {
                "dtype": "float32",
                "context_len": 16,
                "concurrency": 1,
                "status": "ok",
                "tpot_ms_p50": 2.0,
                "error": None,
            },
            {
                "dtype": "float16",
                "context_len": 16,
                "concurrency": 1,
                "status": "ok",
                "tpot_ms_p50": 0.5,
                "error": "non-finite logits in the last decode step",
            },
            {
                "dtype": "float32",
                "context_len": 64,
                "concurrency": 4,
                "status": "oom",
                "tpot_ms_p50": None,
                "error": "CUDA out of memory",
            },
        ]
    )


def test_results_table_sorted_rounded_known_columns_only():
    t = results_table(_rows())
    assert list(t.columns) == ["dtype", "context_len", "concurrency", "status", "tpot_ms_p50"]
    assert list(zip(t.dtype, t.context_len, t.concurrency)) == [
        ("float16", 16, 1),
        ("float32", 16, 1),
        ("float32", 64, 2),
        ("float32", 64, 4),
    ]
    assert t.tpot_ms_p50.iloc[2] == 1.235
    empty = results_table(None)
    assert empty.empty and list(empty.columns) == list(TABLE_COLUMNS)


def test_table_html():
    h = table_html(_rows())
    assert "<table" in h and "kit-results" in h and h.count("<tr") == 5 and "x_step_ms" not in h
    assert "no finished points yet" in table_html(pd.DataFrame())


def test_point_problems_lists_oom_error_and_non_finite():
    probs = point_problems(_rows())
    assert probs == [
        "note: float16 kv=16 B=1: non-finite logits in the last decode step",  # an ok row with an error text
        "oom: float32 kv=64 B=4: CUDA out of memory",
    ]
    assert point_problems(
        pd.DataFrame(
            [{"status": "error", "dtype": "float32", "context_len": 8, "concurrency": 1, "error": float("nan")}]
        )
    ) == ["error: float32 kv=8 B=1"]
    assert point_problems(None) == []


def test_figure_png_closes_the_figure():
    fig = plt.figure()
    fig.add_subplot(111).plot([1, 2], [3, 4])
    n = len(plt.get_fignums())
    data = figure_png(fig)
    assert data[:4] == b"\x89PNG" and len(plt.get_fignums()) == n - 1


def test_snapshot_and_bundle():
    s = snapshot_html("<b>done</b>", b"\x89PNGxyz", "<table></table>")
    assert s.startswith("<div class='kit-snapshot'>") and "data:image/png;base64," in s and "<table>" in s
    assert "<img" not in snapshot_html("idle", None, "") and "<img" not in snapshot_html("idle", b"", "")

    class W:
        def _repr_mimebundle_(self):
            return {"application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "text/plain": "W()"}

    b = widget_bundle(W(), "summary", "<p>snap</p>")
    assert b["text/plain"] == "summary" and b["text/html"] == "<p>snap</p>"
    assert b["application/vnd.jupyter.widget-view+json"] == {"model_id": "x"}


def test_a_flagged_row_never_reads_ok():
    """Status ok with a problem flag (non-finite logits, no error text): the table says flagged and it is listed."""
    df = pd.DataFrame(
        [
            {
                "dtype": "float16",
                "context_len": 16,
                "concurrency": 1,
                "status": "ok",
                "x_logits_finite": False,
                "error": None,
            },
            {
                "dtype": "float32",
                "context_len": 16,
                "concurrency": 1,
                "status": "ok",
                "x_logits_finite": True,
                "error": None,
            },
        ]
    )
    assert list(results_table(df).status) == ["flagged", "ok"]
    probs = point_problems(df)
    assert len(probs) == 1 and probs[0].startswith("flagged: float16 kv=16 B=1: non-finite logits")
