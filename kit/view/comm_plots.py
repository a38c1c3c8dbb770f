"""Interconnect figures: collective latency and bus bandwidth vs message size (``kit comm`` rows), and the decode
step of several systems as stacked bars of the planner's terms beside published figures. Each takes a DataFrame
and column names and returns a matplotlib Figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FuncFormatter

from kit.results import ok_mask
from kit.view.plots import label_of, require_columns

#: decode-step terms (x_t_<term>_ms columns of planner rows) and their legend labels, bottom to top
STEP_TERM_LABELS = {
    "weights": "weights (HBM)",
    "kv": "KV cache (HBM)",
    "compute": "compute",
    "comm_lat": "collectives: latency (α)",
    "comm_bw": "collectives: bandwidth",
    "overhead": "launch/engine overhead",
    "draft": "speculative draft",
}


def _size_label(v: float, _=None) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= div:
            return f"{v / div:g} {unit}"
    return f"{v:g} B"


_LABELS = {"x_lat_us_p50": "latency p50, µs", "x_lat_us_p99": "latency p99, µs", "x_busbw_gb_s": "busbw, GB/s",
           "x_algbw_gb_s": "algbw, GB/s"}  # fmt: skip


def _probe_rows(df: pd.DataFrame) -> pd.DataFrame:
    d = df[ok_mask(df)] if "status" in df.columns else df
    return d[d["x_decode_term"].isna()] if "x_decode_term" in d.columns else d


def collective_figure(df: pd.DataFrame, y: str = "x_lat_us_p50", band: str | None = "x_lat_us_p99"):
    """``y`` vs message size (``x_size_bytes``, the whole buffer), one line per collective (``x_op``), both axes
    log; ``band`` (e.g. p99) drawn dotted in the same colour. Decode-step messages (``x_decode_term``) are marked
    with a star on the all_reduce / all_to_all line they belong to.

    Returns: the Figure. Raises: UserError for a missing column.
    """
    require_columns(df, ["x_op", "x_size_bytes", y])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    d = _probe_rows(df)
    for i, (op, g) in enumerate(d.groupby("x_op", sort=True)):
        g = g.sort_values("x_size_bytes")
        ax.plot(g["x_size_bytes"], g[y], "o-", ms=3, color=f"C{i}", label=op)
        if band and band in g.columns:
            ax.plot(g["x_size_bytes"], g[band], ":", color=f"C{i}", alpha=0.7)
    if "x_decode_term" in df.columns:
        mk = df[df["x_decode_term"].notna()]
        for _, r in mk.iterrows():
            ax.plot(r["x_size_bytes"], r[y], "k*", ms=11)
            ax.annotate(f"decode {r['x_decode_term']}", (r["x_size_bytes"], r[y]), xytext=(5, 6),
                        textcoords="offset points", fontsize=8)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_size_label))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("message size S (whole buffer, nccl-tests convention)")
    name = _LABELS.get(y, label_of(y))
    ax.set_ylabel(name + (" (dotted: p99)" if band and band in d.columns else ""))
    ns = sorted({int(v) for v in d["x_n_ranks"].dropna()}) if "x_n_ranks" in d.columns else []
    n = "/".join(map(str, ns)) or "?"
    where = d["device_name"].iloc[0] if "device_name" in d.columns and len(d) else ""
    ax.set_title(f"{name} vs message size, {n} ranks, {where}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    return fig


def save_comm_plots(df: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """``comm_latency.png`` (p50 latency, p99 dotted) and ``comm_busbw.png`` (busbw) in ``out_dir``."""
    out = Path(out_dir)
    paths = []
    for name, y, band in (
        ("comm_latency.png", "x_lat_us_p50", "x_lat_us_p99"),
        ("comm_busbw.png", "x_busbw_gb_s", None),
    ):
        fig = collective_figure(df, y, band)
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)
    return paths


def _term_col(term: str) -> str:
    """The planner column of a step term (the compute-bound part of the roofline is ``x_t_compute_part_ms``)."""
    return "x_t_compute_part_ms" if term == "compute" else f"x_t_{term}_ms"


def decode_step_bars(df: pd.DataFrame, label: str = "system", published: str | None = "published_ms"):
    """One stacked bar per row (``label``): the decode step's terms (:data:`STEP_TERM_LABELS`, ``x_t_<term>_ms``
    columns of planner rows, ``x_t_compute_part_ms`` for compute; ms), with the published step time
    (``published``, ms = 1000 / published tok/s per stream) as a black bar beside it and the
    predicted/published ratio above.

    Returns: the Figure. Raises: UserError for a missing column.
    """
    cols = [_term_col(t) for t in STEP_TERM_LABELS]
    require_columns(df, [label, *cols])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.9 * len(df)), 4.8))
    x = range(len(df))
    bottom = [0.0] * len(df)
    for i, (t, name) in enumerate(STEP_TERM_LABELS.items()):
        v = df[_term_col(t)].fillna(0.0).tolist()
        if not any(v):
            continue
        ax.bar([j - 0.18 for j in x], v, 0.34, bottom=bottom, color=f"C{i}", label=name)
        bottom = [b + a for a, b in zip(v, bottom)]
    if published and published in df.columns:
        ax.bar([j + 0.18 for j in x], df[published], 0.34, color="0.15", label="published (1000 / tok/s per user)")
        for j, (p, q) in enumerate(zip(bottom, df[published])):
            ax.annotate(f"×{p / q:.2f}", (j - 0.18, p), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(df[label], fontsize=9)
    ax.set_ylabel("decode step, ms (per user)")
    ax.set_title("decode step: planner terms (left) vs published (right)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
