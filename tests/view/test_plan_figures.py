"""The planner figures of kit.view.plots: each takes a DataFrame and column names and returns a Figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from kit.errors import UserError  # noqa: E402
from kit.plan.config import PredictConfig  # noqa: E402
from kit.plan.fit import memory_fit  # noqa: E402
from kit.plan.roofline import predict_grid, predict_like  # noqa: E402
from kit.view import plan_plots  # noqa: E402

CAL = {
    "device": "cpu",
    "memory_gb": 16.0,
    "mem_bw_gb_s": 10.0,
    "matmul_tflops": {"float32": 0.1},
    "overhead_ms_fixed": 1.0,
    "overhead_ms_per_layer": 0.5,
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _measured():
    return pd.DataFrame(
        [
            {
                "backend": "engine",
                "status": "ok",
                "model": "tiny-llama",
                "dtype": "float32",
                "concurrency": b,
                "context_len": c,
                "decode_steps": 16,
                "tpot_ms_p50": 5.0 + c / 256,
            }
            for b in (1, 4)
            for c in (128, 512)
        ]
    )


def _lines(fig, i=0):
    return [ln for ln in fig.axes[i].get_lines() if len(ln.get_xdata())]


def test_overlay_figure_planner_dashed_over_measured():
    measured = _measured()
    pred = predict_like(measured, PredictConfig("local", calibration=CAL))
    fig = plan_plots.overlay_figure(measured, pred)
    ax = fig.axes[0]
    assert ax.get_title().startswith("planner (dashed) vs measured (solid): median |error|")
    styles = sorted(ln.get_linestyle() for ln in _lines(fig))
    assert styles == ["-", "-", "--", "--"]
    assert len(ax.texts) == 4 and all(t.get_text().endswith("%") for t in ax.texts)  # one error per point
    with pytest.raises(UserError, match="nope"):
        plan_plots.overlay_figure(measured, pred, y="nope")


def test_stacked_bars_memory_breakdown(tmp_path):
    fits = {acc: memory_fit("kimi-k3", 1424, config=PredictConfig(acc, 8)) for acc in ("MI355X", "B300")}
    mem = pd.DataFrame(
        [{"system": f"8x{a}", **r.memory_parts(), "users": f"{r.max_concurrency:,} users"} for a, r in fits.items()]
    )
    parts = ["weights", "reserve", "kv_at_max_users", "unused"]
    fig = plan_plots.stacked_bars(mem, "system", parts, note="users", title="memory per GPU")
    ax = fig.axes[0]
    assert len(ax.patches) == len(parts) * 2
    widths = [sum(p.get_width() for p in ax.patches[i::2]) for i in range(2)]  # each bar: the whole GPU
    assert widths == pytest.approx([fits["MI355X"].mem_gb_per_gpu, fits["B300"].mem_gb_per_gpu])
    assert [t.get_text() for t in ax.texts] == list(mem["users"])
    fig.savefig(tmp_path / "m.png")
    with pytest.raises(UserError, match="'nope'"):
        plan_plots.stacked_bars(mem, "system", ["nope"])


def test_grouped_bars_label_each_value():
    df = pd.DataFrame({"model": ["llama-3.1-8b", "deepseek-v3"], "bf16": [131072, 70272], "fp8": [65536, 35136]})
    fig = plan_plots.grouped_bars(df, "model", ["bf16", "fp8"], logx=True)
    ax = fig.axes[0]
    assert len(ax.patches) == 4 and ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.texts] == ["131,072", "70,272", "65,536", "35,136"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["llama-3.1-8b", "deepseek-v3"]


def test_curves_colour_per_hue_style_per_source_and_skip_not_ok():
    df = pd.DataFrame(
        [
            {
                "accelerator": a,
                "source": s,
                "status": "ok" if c < 64 else st,
                "tok_s_per_stream": 100 / c,
                "usd_per_mtok": c * (2 if s == "published" else 1),
            }
            for a in ("MI355X", "B300")
            for s, st in (("published", "ok"), ("planner", "oom"))
            for c in (1, 8, 64)
        ]
    )
    fig = plan_plots.curves(df, "tok_s_per_stream", "usd_per_mtok", hue="accelerator", style="source", log="xy")
    lines = _lines(fig)
    assert len(lines) == 4
    by = {ln.get_label(): ln for ln in lines}
    assert by["MI355X · planner"].get_color() == by["MI355X · published"].get_color()
    assert by["MI355X · planner"].get_linestyle() != by["MI355X · published"].get_linestyle()
    assert len(by["MI355X · planner"].get_xdata()) == 2  # the oom point is not drawn as a cost
    assert fig.axes[0].get_ylabel() == "$ per million tokens"


def test_cost_vs_interactivity_two_panels_from_planner_rows():
    from kit.plan.cost import add_cost_columns

    g = pd.concat(
        [
            add_cost_columns(predict_grid("llama-3.1-8b", (1, 8, 64), (2048,), PredictConfig(a)), basis="tco")
            for a in ("MI355X", "H200")
        ],
        ignore_index=True,
    )
    fig = plan_plots.cost_vs_interactivity(g, hue="accelerator", title="cost")
    assert len(fig.axes) == 2 and fig.axes[1].get_title() == "cost"
    assert len(_lines(fig, 0)) == 2 and len(_lines(fig, 1)) == 2
    assert fig.axes[0].get_ylabel() == "tok/s/GPU"


def test_decode_panels_side_by_side():
    rows = [
        {
            "backend": "engine",
            "status": "ok",
            "model": "m",
            "dtype": "float32",
            "context_len": kv,
            "concurrency": b,
            "tpot_ms_p50": 2 + kv / 256 + b / 8,
            "decode_tok_s": b * 100.0,
        }
        for kv in (128, 512)
        for b in (1, 4)
    ]
    from kit.results import to_frame

    fig = plan_plots.decode_panels(to_frame(rows))
    assert len(fig.axes) == 2
    assert fig.axes[0].get_xlabel() == "concurrency (batch size)"
    assert fig.axes[1].get_xlabel() == "KV-cache length (tokens)"
