"""Figures of ``kit qualify``: the op checks as a grid of cells (op × dtype/mode, coloured by outcome) and a
cluster's headline figures per node (the outlier marked). Each takes a DataFrame and returns a matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap

from kit.view.plots import require_columns

#: outcome → (grid value, colour, legend label)
OUTCOMES = {"pass": (0, "#7bc77b", "pass"), "fail": (1, "#e05555", "fail"), "error": (2, "#8b0000", "error"),
            "skipped": (3, "#cccccc", "skipped / not run")}  # fmt: skip


def op_check_grid(df: pd.DataFrame):
    """Ops (rows) × dtype/mode (columns) of :func:`kit.check.harness.check_op` rows (``op``, ``dtype``, ``mode``,
    ``status``); a cell is its worst input's outcome (error > fail > pass > skipped); a pair never checked (a
    compiled check the budget did not reach) is grey. Returns the Figure."""
    require_columns(df, ["op", "dtype", "mode", "status"])
    rank = {"skipped": 0, "pass": 1, "fail": 2, "error": 3}
    worst = df.assign(r=df["status"].map(rank)).groupby(["op", "dtype", "mode"])["r"].max().reset_index()
    ops = sorted(df["op"].unique())
    cols = sorted({(m, d) for d, m in zip(worst["dtype"], worst["mode"])}, key=lambda t: (t[0] != "eager", t[1]))
    back = {v: k for k, v in rank.items()}
    grid = np.full((len(ops), len(cols)), OUTCOMES["skipped"][0], dtype=float)
    for _, r in worst.iterrows():
        grid[ops.index(r["op"]), cols.index((r["mode"], r["dtype"]))] = OUTCOMES[back[int(r["r"])]][0]
    cmap = ListedColormap([c for _, c, _ in sorted(OUTCOMES.values())])
    fig, ax = plt.subplots(figsize=(1.2 * len(cols) + 3.5, 0.42 * len(ops) + 1.6))
    ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=3.5, aspect="auto")
    ax.set_xticks(range(len(cols)), [f"{m}\n{d}" for m, d in cols], fontsize=8)
    ax.set_yticks(range(len(ops)), ops, fontsize=8)
    for (i, j), v in np.ndenumerate(grid):
        ax.text(j, i, {0: "ok", 1: "FAIL", 2: "ERR", 3: "-"}[int(v)], ha="center", va="center", fontsize=7)
    n_bad = int((grid == 1).sum() + (grid == 2).sum())
    ax.set_title(f"sampling ops vs the reference: {n_bad} failing cell(s) of {int((grid != 3).sum())}", fontsize=10)
    fig.tight_layout()
    return fig


def node_comparison(df: pd.DataFrame, outliers: dict | None = None):
    """One panel per item: each node's headline figure as a bar (``df``: ``node``, ``item``, ``value``,
    ``verdict``, ``unit``, ``name``), the cluster median dashed, a failing node's bar red and the outlier named in
    ``outliers`` (item → node) hatched. Returns the Figure."""
    require_columns(df, ["node", "item", "value", "verdict"])
    d = df.dropna(subset=["value"])
    items = list(dict.fromkeys(d["item"]))
    cols = min(4, max(1, len(items)))
    rows = -(-max(1, len(items)) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 3.0 * rows), squeeze=False)
    for ax in axes.flat[len(items) :]:
        ax.set_visible(False)
    for ax, item in zip(axes.flat, items):
        g = d[d["item"] == item]
        colors = ["#e05555" if v == "fail" else "#f0b840" if v == "warn" else "#5a8fd6" for v in g["verdict"]]
        bars = ax.bar(g["node"].astype(str), g["value"], color=colors)
        for b, node in zip(bars, g["node"]):
            if (outliers or {}).get(item) == node:
                b.set_hatch("//")
                b.set_edgecolor("black")
        ax.axhline(float(g["value"].median()), ls="--", color="grey", lw=1)
        unit = g["unit"].iloc[0] if "unit" in g else ""
        ax.set_title(f"{item}\n{g['name'].iloc[0] if 'name' in g else ''}", fontsize=8)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle("headline figure per node (dashed: median; hatched: the outlier; red: failed)", fontsize=9)
    fig.tight_layout()
    return fig
