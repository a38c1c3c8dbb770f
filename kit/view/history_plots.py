"""Figures of performance per commit (:mod:`kit.track`): a metric vs commit per point group, with interval bands
and regressions marked.

Input is the per-commit summary of :func:`kit.track.report.history_frame`: one row per (commit, point group) with
the metric's median over the commit's independent runs, its 95 % interval (``<metric>_lo`` / ``<metric>_hi``;
NaN with a single run) and ``regression_<metric>`` (True where ``kit history compare`` with the previous commit
flagged that point and metric).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kit.view.plots import require_columns

HISTORY_LABELS = {
    "tok_s": "decode throughput (tok/s)",
    "tpot_ms": "TPOT p50 (ms)",
    "ttft_ms": "TTFT (ms)",
    "tok_s_per_usd": r"tok/s per dollar (tokens per \$)",
    "usd_per_mtok": "$ per million tokens",
}


def metric_vs_commit(
    df: pd.DataFrame,
    y: str = "tok_s",
    commits: list[str] | None = None,
    group: str = "label",
    title: str | None = None,
    logy: bool = True,
):
    """``y`` vs commit, one line per ``group`` value, a shaded band from ``y_lo`` to ``y_hi`` where known, and a
    red ring on each (commit, group) whose ``regression_<y>`` is True.

    Args:
        df: columns ``commit``, ``group``, ``y`` (+ optional ``y_lo``, ``y_hi``, ``regression_<y>``).
        commits: the x order (default: order of appearance); commits missing for a group leave a gap.
        logy: log y axis (point groups differ by orders of magnitude).

    Returns: a matplotlib Figure. Raises: UserError when a column is missing.
    """
    require_columns(df, ["commit", group, y])
    commits = commits or list(dict.fromkeys(df["commit"]))
    pos = {c: i for i, c in enumerate(commits)}
    fig, ax = plt.subplots(figsize=(9, 4.2))
    flag_col = f"regression_{y}"
    for i, (name, g) in enumerate(df.groupby(group, sort=True)):
        g = g.assign(_x=g["commit"].map(pos)).dropna(subset=["_x"]).sort_values("_x")
        color = f"C{i % 10}"
        ax.plot(g["_x"], g[y], marker="o", ms=4, color=color, label=str(name))
        if f"{y}_lo" in g.columns and g[f"{y}_lo"].notna().any():
            ax.fill_between(g["_x"], g[f"{y}_lo"], g[f"{y}_hi"], color=color, alpha=0.18, lw=0)
        if flag_col in g.columns:
            bad = g[g[flag_col].fillna(False).astype(bool)]
            ax.scatter(bad["_x"], bad[y], s=140, facecolors="none", edgecolors="red", linewidths=2, zorder=5)
    if flag_col in df.columns and df[flag_col].fillna(False).astype(bool).any():
        ax.scatter([], [], s=140, facecolors="none", edgecolors="red", linewidths=2, label="regression")
    ax.set_xticks(np.arange(len(commits)))
    ax.set_xticklabels([str(c)[:10] for c in commits], rotation=45, ha="right", fontsize=8)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("commit (oldest → newest)")
    ax.set_ylabel(HISTORY_LABELS.get(y, y))
    ax.set_title(title or f"{HISTORY_LABELS.get(y, y)} per commit (band: 95% interval over runs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig
