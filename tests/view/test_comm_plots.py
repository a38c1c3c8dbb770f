"""The interconnect figures of kit.view.comm_plots on hand-made frames (no ranks started)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from kit.errors import UserError
from kit.view.comm_plots import collective_figure, decode_step_bars


def _curves(n_ranks):
    rows = [{"x_op": f"all_reduce ({n})", "x_size_bytes": s, "x_lat_us_p50": 7.0 + s / 1e6, "x_n_ranks": n,
             "x_decode_term": None} for n in n_ranks for s in (8, 1024, 1 << 20)]  # fmt: skip
    rows.append({"x_op": "all_reduce (8)", "x_size_bytes": 14336, "x_lat_us_p50": 7.0, "x_n_ranks": 8,
                 "x_decode_term": "B=1"})  # fmt: skip
    return pd.DataFrame(rows)


def test_collective_figure_names_every_rank_count_and_marks_decode_messages():
    fig = collective_figure(_curves([8, 16]), band=None)
    ax = fig.axes[0]
    assert "8/16 ranks" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["all_reduce (16)", "all_reduce (8)"]
    assert [t.get_text() for t in ax.texts] == ["decode B=1"]
    plt.close(fig)
    fig = collective_figure(_curves([2]), band=None)
    assert "2 ranks" in fig.axes[0].get_title()
    plt.close(fig)


def test_decode_step_bars_stack_the_terms_and_show_the_ratio():
    terms = {"x_t_weights_ms": 3.0, "x_t_kv_ms": 0.0, "x_t_compute_part_ms": 0.0, "x_t_comm_lat_ms": 2.0,
             "x_t_comm_bw_ms": 0.0, "x_t_overhead_ms": 1.0, "x_t_draft_ms": 0.0}  # fmt: skip
    df = pd.DataFrame([{"system": "a", **terms, "published_ms": 5.0}, {"system": "b", **terms, "published_ms": 12.0}])
    fig = decode_step_bars(df)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["×1.20", "×0.50"]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:3] == ["weights (HBM)", "collectives: latency (α)", "launch/engine overhead"]  # zero terms left out
    plt.close(fig)
    with pytest.raises(UserError, match="x_t_draft_ms"):
        decode_step_bars(df.drop(columns="x_t_draft_ms"))
