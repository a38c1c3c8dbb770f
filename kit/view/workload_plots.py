"""Figures of the served workloads: the SLO search on the goodput curve, TTFT per turn of multi-turn sessions,
TTFT against the shared-prefix fraction, and the metric conventions side by side. Each takes a DataFrame (and
column names) and returns a matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from kit.view.plots import label_of, require_columns


def slo_search_plot(
    rows: pd.DataFrame, answer: float | None, axis: str = "concurrency", slo_fraction: float = 0.9, line: str = ""
):
    """The goodput curve of an SLO search's probes with the answer marked.

    Args:
        rows: the probes' results rows (:attr:`kit.serve.slo.SearchResult.rows`): ``goodput_rps``,
            ``x_good_requests``, ``completed``, ``failed`` and ``concurrency`` (axis "concurrency") or
            ``request_rate`` (axis "rate").
        answer: the largest load that met the SLO (a dashed vertical line), or None.
        slo_fraction: the required fraction (a dotted horizontal line on the right axis).
        line: the one-line answer, used as the title.

    Raises:
        UserError: a column missing.
    """
    x = "concurrency" if axis == "concurrency" else "request_rate"
    require_columns(rows, [x, "goodput_rps", "x_good_requests", "completed", "failed"])
    d = rows.assign(_x=rows[x].astype(float)).sort_values("_x")
    n = (d["completed"].fillna(0) + d["failed"].fillna(0)).astype(float)
    frac = d["x_good_requests"].astype(float) / n.where(n > 0)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(d["_x"], d["goodput_rps"].astype(float), marker="o", label="goodput (req/s meeting every SLO)")
    ax.plot(
        d["_x"], d["request_throughput"].astype(float), marker=".", ls=":", c="grey", label="request throughput (req/s)"
    )
    ax2 = ax.twinx()
    met = frac >= slo_fraction
    ax2.scatter(d["_x"][met], frac[met], marker="^", c="tab:green", label="probe met the SLO", zorder=3)
    ax2.scatter(d["_x"][~met], frac[~met], marker="v", c="tab:red", label="probe missed it", zorder=3)
    ax2.axhline(slo_fraction, ls=":", c="k", lw=1)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("fraction of requests meeting the SLO")
    if answer is not None:
        ax.axvline(float(answer), ls="--", c="tab:green", lw=1.5)
        ax.annotate(
            f"answer: {answer:g}",
            (float(answer), ax.get_ylim()[1] * 0.95),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=8,
        )
    ax.set_xscale("log", base=2)
    loads = sorted(set(d["_x"]))
    ax.set_xticks(loads, [f"{v:g}" for v in loads], fontsize=7)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(label_of(x) if x == "concurrency" else "request rate (req/s)")
    ax.set_ylabel("requests/s")
    ax.grid(alpha=0.3)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower right")
    ax.set_title(line or "SLO search", fontsize=9)
    fig.tight_layout()
    return fig


def per_turn_plot(turns: pd.DataFrame, label: str = ""):
    """TTFT p50 / p90 per turn of multi-turn sessions (:func:`kit.serve.sessions.per_turn`), with the mean
    cached prompt tokens per turn on the right axis when the server reported them.

    Raises:
        UserError: a column missing.
    """
    require_columns(turns, ["turn", "ttft_ms_p50", "ttft_ms_p90"])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(turns["turn"], turns["ttft_ms_p50"], marker="o", label=f"TTFT p50 {label}".strip())
    ax.plot(turns["turn"], turns["ttft_ms_p90"], marker=".", ls="--", label=f"TTFT p90 {label}".strip())
    if "cached_tokens_mean" in turns and turns["cached_tokens_mean"].notna().any():
        ax2 = ax.twinx()
        ax2.bar(
            turns["turn"],
            turns["cached_tokens_mean"].astype(float),
            alpha=0.2,
            color="tab:green",
            label="cached tokens",
        )
        ax2.set_ylabel("cached prompt tokens (mean)")
        ax2.legend(fontsize=7, loc="upper right")
    ax.set_xticks(list(turns["turn"]))
    ax.set_xlabel("turn of the conversation")
    ax.set_ylabel("TTFT (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("time to first token per turn (history grows every turn)", fontsize=9)
    fig.tight_layout()
    return fig


def prefix_plot(df: pd.DataFrame, y: str = "ttft_ms", hue: str = "concurrency"):
    """``y`` (default median TTFT) against the shared-prefix fraction (``x_prefix_fraction``), one line per
    ``hue`` value; the intended (and, when reported, achieved) hit rate annotated at each point.

    Raises:
        UserError: a column missing.
    """
    require_columns(df, ["x_prefix_fraction", y, hue, "x_prefix_hit_rate_intended"])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for h, g in df.sort_values("x_prefix_fraction").groupby(hue):
        ax.plot(g["x_prefix_fraction"], g[y].astype(float), marker="o", label=f"{hue}={h}")
        for _, r in g.iterrows():
            got = r.get("x_prefix_hit_rate_achieved")
            txt = f"hit {r['x_prefix_hit_rate_intended']:.0%}" + (
                "" if got is None or pd.isna(got) else f" / {got:.0%}"
            )
            ax.annotate(
                txt, (r["x_prefix_fraction"], float(r[y])), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
    ax.set_xlabel("shared-prefix fraction of each prompt")
    ax.set_ylabel(label_of(y) if y != "ttft_ms" else "TTFT p50 (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("prefix sharing (labels: intended / achieved cache hit rate)", fontsize=9)
    fig.tight_layout()
    return fig


def conventions_plot(table: pd.DataFrame):
    """The p50 of each convention of :func:`kit.serve.conventions.metric_conventions`, one panel per quantity
    (ITL/TPOT in ms, interactivity in tok/s), bars labelled with their source.

    Raises:
        UserError: a column missing.
    """
    require_columns(table, ["quantity", "convention", "p50", "unit", "source"])
    groups = [
        ("latency per token (ms)", table[table["unit"] == "ms"]),
        ("interactivity (tok/s)", table[table["unit"] != "ms"]),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, (title, g) in zip(axes, groups, strict=True):
        names = [f"{q}: {c}\n({s})" for q, c, s in zip(g["quantity"], g["convention"], g["source"], strict=True)]
        ys = np.arange(len(g))
        ax.barh(ys, g["p50"].astype(float), color="tab:blue", alpha=0.7)
        for yy, v in zip(ys, g["p50"].astype(float), strict=True):
            ax.annotate(f"{v:.2f}", (v, yy), fontsize=7, xytext=(3, -3), textcoords="offset points")
        ax.set_yticks(ys, names, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("one capture, each tool's definition (median)", fontsize=10)
    fig.tight_layout()
    return fig
