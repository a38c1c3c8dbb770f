"""Plots build from result frames and show OOM points instead of dropping them."""

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from kit import results  # noqa: E402
from kit.view import plots


def _frame():
    rows = []
    for kv in (128, 512):
        for b in (1, 4, 16):
            oom = kv == 512 and b == 16
            rows.append(
                {
                    "backend": "engine",
                    "status": "oom" if oom else "ok",
                    "model": "tiny-llama",
                    "dtype": "float32",
                    "context_len": kv,
                    "concurrency": b,
                    "tpot_ms_p50": None if oom else 2 + kv / 256 + b / 8,
                    "tpot_ms_p90": None if oom else 3 + kv / 256 + b / 8,
                    "decode_tok_s": None if oom else b * 1000 / (2 + kv / 256 + b / 8),
                }
            )
    return results.to_frame(rows)


def test_line_plots_show_oom_points(tmp_path):
    df = _frame()
    fig = plots.throughput_vs_concurrency(df)
    ax = fig.axes[0]
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert "OOM / error (not measured)" in labels
    red_x = [ln for ln in ax.get_lines() if ln.get_marker() == "x" and len(ln.get_xdata())]
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
    assert any("B300" in ln.get_label() for ln in fig.axes[0].get_lines())
    with pytest.raises(ValueError, match="'nope'"):
        plots.line_plot(both, "concurrency", "nope", "context_len")
    with pytest.raises(ValueError, match="several rows"):
        plots.heatmap(both)


def test_save_standard_plots(tmp_path):
    paths = plots.save_standard_plots(_frame(), tmp_path)
    assert len(paths) == 3 and all(p.stat().st_size > 10_000 for p in paths)


def test_compare_plot_one_style_per_label():
    a, b = _frame(), _frame()
    a["label"], b["label"] = "MI355X", "B300"
    fig = plots.compare_plot(pd.concat([a, b], ignore_index=True))
    ax = fig.axes[0]
    assert "MI355X vs B300" in ax.get_title() and ax.get_yscale() == "log"
    styles = {ln.get_linestyle() for ln in ax.get_lines() if ln.get_marker() == "o"}
    assert len(styles) == 2
    with pytest.raises(ValueError, match="label"):
        plots.compare_plot(_frame())


def test_dtype_plot_draws_non_finite_points_as_not_measured():
    a, b = _frame(), _frame()
    b["dtype"] = "float16"
    b["x_logits_finite"] = [True, True, False, True, True, None]  # float16 kv=128 B=16 overflowed
    a["x_logits_finite"] = True
    fig = plots.dtype_plot(pd.concat([a, b], ignore_index=True))
    ax = fig.axes[0]
    red = [ln for ln in ax.get_lines() if ln.get_marker() == "x" and len(ln.get_xdata())]
    assert sorted(x for ln in red for x in ln.get_xdata()) == [16, 16, 16]  # the two OOMs and the overflow
    f16_128 = [ln for ln in ax.get_lines() if ln.get_label() == "KV-cache length 128 · float16"][0]
    assert list(f16_128.get_xdata()) == [1, 4]


def test_knee_plot_marks_reached_knees(tmp_path):
    from kit.view.analysis import concurrency_knee

    df = _frame()
    knee = pd.DataFrame(
        [
            {"context_len": 128, "knee": 4, "reached": True, "y_at_knee": 1000.0},
            {"context_len": 512, "knee": None, "reached": False, "y_at_knee": float("nan")},
        ]
    )
    fig = plots.knee_plot(df, knee)
    ax = fig.axes[0]
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["knee kv=128: B=4"]
    vlines = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [4, 4]]
    assert len(vlines) == 1
    fig.savefig(tmp_path / "knee.png")
    assert plots.knee_plot(df, concurrency_knee(df)).axes  # straight from the analysis
    with pytest.raises(ValueError, match="reached"):
        plots.knee_plot(df, knee.drop(columns=["reached"]))


def test_flagged_points_are_not_drawn_as_measured():
    df = _frame()
    df["x_logits_finite"] = [True, False, True, True, True, None]  # kv=128 B=4 overflowed
    ax = plots.throughput_vs_concurrency(df).axes[0]
    kv128 = [ln for ln in ax.get_lines() if ln.get_label() == "KV-cache length 128"][0]
    assert list(kv128.get_xdata()) == [1, 16]
    texts = [t.get_text() for t in plots.heatmap(df).axes[0].texts]
    assert "FLAGGED" in texts and "OOM" in texts


def test_value_grids_one_row_per_format(tmp_path):
    from kit.check.fp8 import positive_values
    from kit.view.plots import value_grids

    fig = value_grids({f: positive_values(f).numpy() for f in ("e4m3fn", "e4m3fnuz")})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["e4m3fn", "e4m3fnuz"] and ax.get_xscale() == "log"
    assert len(ax.collections) == 2 and ax.collections[0].get_offsets().shape[0] > 100
    fig.savefig(tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 5000
    with pytest.raises(ValueError, match="values is empty"):
        value_grids({})
