"""Plots build from result frames and show OOM points instead of dropping them."""
import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from kit.view import plots
from kit import results  # noqa: E402


def _frame():
    rows = []
    for kv in (128, 512):
        for b in (1, 4, 16):
            oom = kv == 512 and b == 16
            rows.append({"backend": "engine", "status": "oom" if oom else "ok", "model": "tiny-llama",
                         "dtype": "float32", "context_len": kv, "concurrency": b,
                         "tpot_ms_p50": None if oom else 2 + kv / 256 + b / 8,
                         "tpot_ms_p90": None if oom else 3 + kv / 256 + b / 8,
                         "decode_tok_s": None if oom else b * 1000 / (2 + kv / 256 + b / 8)})
    return results.to_frame(rows)


def test_line_plots_show_oom_points(tmp_path):
    df = _frame()
    fig = plots.throughput_vs_concurrency(df)
    ax = fig.axes[0]
    labels = [l.get_label() for l in ax.get_lines()]
    assert "OOM / error (not measured)" in labels
    red_x = [l for l in ax.get_lines() if l.get_marker() == "x" and len(l.get_xdata())]
    assert red_x and list(red_x[0].get_xdata()) == [16]
    fig2 = plots.tpot_vs_context(df)
    assert fig2.axes[0].get_xlabel() == "KV-cache length (tokens)"


def test_heatmap_marks_oom_cells():
    fig = plots.heatmap(_frame())
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "OOM" in texts and len(texts) == 6


def test_compare_by_label_and_errors():
    a, b = _frame(), _frame()
    a["device_name"], b["device_name"] = "MI355X", "B300"
    both = pd.concat([a, b], ignore_index=True)
    fig = plots.throughput_vs_concurrency(both, label="device_name")
    assert any("B300" in l.get_label() for l in fig.axes[0].get_lines())
    with pytest.raises(ValueError, match="'nope'"):
        plots.line_plot(both, "concurrency", "nope", "context_len")
    with pytest.raises(ValueError, match="several rows"):
        plots.heatmap(both)


def test_save_standard_plots(tmp_path):
    paths = plots.save_standard_plots(_frame(), tmp_path)
    assert len(paths) == 3 and all(p.stat().st_size > 10_000 for p in paths)
