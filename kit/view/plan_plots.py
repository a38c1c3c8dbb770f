"""Planner figures: predicted vs measured, memory breakdowns, KV tables, cost vs interactivity, decode-step
panels. Each takes a DataFrame and column names and returns a matplotlib Figure (sweep and served figures are in
:mod:`kit.view.plots`)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kit.results import ok_mask
from kit.view.plots import label_of, require_columns, throughput_vs_concurrency, tpot_vs_context


# ---------------------------------------------------------------- planner figures
def _ok(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that count as ok (:func:`kit.results.ok_mask`; flagged rows are left out), or all without status."""
    return df[ok_mask(df)] if "status" in df.columns else df


def _log_plain(ax, axis: str) -> None:
    """Log scale on ``axis`` ("x" or "y") with plain numbers at 1, 2, 5 × 10^k (more within less than a decade).
    Call it after plotting."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    getattr(ax, f"set_{axis}scale")("log")
    lo, hi = getattr(ax, f"get_{axis}lim")()
    a = getattr(ax, f"{axis}axis")
    a.set_major_locator(LogLocator(subs=(1, 2, 5) if hi > 10 * lo > 0 else (1, 2, 3, 4, 5, 6, 8)))
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(NullFormatter())


def overlay_figure(
    measured: pd.DataFrame,
    predicted: pd.DataFrame,
    x: str = "context_len",
    y: str = "tpot_ms_p50",
    hue: str = "concurrency",
):
    """Predicted (dashed) over measured (solid, markers) ``y`` vs ``x``, one colour per ``hue`` value; for TPOT the
    per-point error in % (:func:`kit.plan.roofline.prediction_error`) is annotated and its median is in the title.

    Returns: the Figure. Raises: UserError for a missing column.
    """
    from kit.plan.roofline import prediction_error

    for d in (measured, predicted):
        require_columns(d, [x, y, hue])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    err = prediction_error(measured, predicted, y) if y == "tpot_ms_p50" else None
    m, p = _ok(measured), _ok(predicted)
    for i, (hv, g) in enumerate(sorted(m.groupby(hue), key=lambda t: t[0])):
        col = f"C{i % 10}"
        g = g.sort_values(x)
        ax.plot(g[x], g[y], "o-", color=col, label=f"{hue}={hv} measured")
        gp = p[p[hue] == hv].sort_values(x)
        ax.plot(gp[x], gp[y], "--", color=col, alpha=0.8, label=f"{hue}={hv} planner")
        if err is not None:
            for _, r in err[err[hue] == hv].iterrows():
                ax.annotate(
                    f"{r['error_pct']:+.0f}%",
                    (r[x], r["measured"]),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=7,
                    color=col,
                )
    ax.set_xscale("log", base=2)
    xs = sorted(pd.to_numeric(m[x], errors="coerce").dropna().unique())
    if xs:
        ax.set_xticks(xs, [f"{v:g}" for v in xs])
    _log_plain(ax, "y")
    ax.set(xlabel=label_of(x), ylabel=label_of(y))
    title = "planner (dashed) vs measured (solid)"
    if err is not None and len(err):
        title += f": median |error| {err['error_pct'].abs().median():.0f}% (n={len(err)})"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def stacked_bars(
    df: pd.DataFrame,
    label: str,
    parts: list[str],
    note: str | None = None,
    xlabel: str = "GB per GPU",
    title: str | None = None,
):
    """Horizontal stacked bars: one bar per row (named by column ``label``), one segment per column of ``parts``
    (e.g. the GB of :meth:`kit.plan.fit.FitResult.memory_parts`), ``note`` (a column) written after each bar.

    Returns: the Figure. Raises: UserError for a missing column.
    """
    require_columns(df, [label, *parts, note])
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.7 * len(df)))
    names = [str(v) for v in df[label]]
    left = np.zeros(len(df))
    for col in parts:
        vals = df[col].astype(float).fillna(0).to_numpy()
        ax.barh(names, vals, left=left, label=label_of(col).replace("_", " "))
        left = left + vals
    if note:
        for i, v in enumerate(df[note]):
            ax.text(left[i] * 1.01, i, str(v), va="center", fontsize=8)
    ax.set_xlim(0, max(left.max(), 1e-9) * 1.2)
    ax.invert_yaxis()
    ax.set(xlabel=xlabel, title=title or f"{', '.join(parts)} per {label}")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(parts))
    fig.tight_layout()
    return fig


def grouped_bars(
    df: pd.DataFrame,
    label: str,
    values: list[str],
    xlabel: str | None = None,
    title: str | None = None,
    logx: bool = False,
):
    """Horizontal grouped bars: one group per row (named by ``label``), one bar per column of ``values`` (e.g. KV
    bytes per token in bf16 and fp8, or per token in total and per GPU under TP), each labelled with its value.

    Returns: the Figure. Raises: UserError for a missing column.
    """
    require_columns(df, [label, *values])
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.3 * len(df) * len(values)))
    y = np.arange(len(df))
    h = 0.8 / len(values)
    for i, col in enumerate(values):
        vals = df[col].astype(float).to_numpy()
        bars = ax.barh(y + i * h, vals, height=h, label=label_of(col))
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in vals], fontsize=7, padding=2)
    ax.set_yticks(y + h * (len(values) - 1) / 2, [str(v) for v in df[label]])
    ax.invert_yaxis()
    if logx:
        ax.set_xscale("log")
    ax.set_xlim(right=ax.get_xlim()[1] * (3 if logx else 1.15))
    ax.set(xlabel=xlabel or ", ".join(values), title=title or f"{', '.join(values)} per {label}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def curves(
    df: pd.DataFrame,
    x: str,
    y: str,
    hue: str,
    style: str | None = None,
    log: str = "y",
    markers: bool = True,
    labels: dict | None = None,
):
    """One line of ``y`` over ``x`` per ``hue`` value (one colour each), and per ``style`` value one line style and
    marker (e.g. ``source``: published vs planner); rows not ok are left out. Returns the Figure.

    Args:
        log: the axes on a log scale with plain tick numbers: ``"y"`` (default), ``"xy"``, ``"x"`` or ``""``.
        markers: a marker on every point (off: lines only, for dense curves).
        labels: axis texts replacing the defaults (``title``, ``xlabel``, ``ylabel``: keys of matplotlib's
            ``Axes.set``), e.g. ``{"ylabel": "time per decode step (ms)", "title": "..."}``.

    Raises: UserError for a missing column.
    """
    require_columns(df, [x, y, hue, style])
    fig = plt.figure(figsize=(7, 4.2))
    ax = fig.add_subplot(111)
    _draw_curves(ax, df, x, y, hue, style, _LOOKS if markers else _PLAIN_LOOKS)
    _finish_curves(ax, x, y, log, labels)
    return fig


_LOOKS = ["o-", "s--", "^:", "d-."]
_PLAIN_LOOKS = ["-", "--", ":", "-."]


def _draw_curves(ax, df: pd.DataFrame, x: str, y: str, hue: str, style: str | None, looks: list[str]) -> None:
    """The lines of :func:`curves` on ``ax``: ok rows only, a colour per ``hue`` value, a look per ``style`` value."""
    d = _ok(df)
    colours = {h: f"C{i % 10}" for i, h in enumerate(sorted(d[hue].dropna().unique(), key=str))}
    styles = {s: looks[i % 4] for i, s in enumerate(d[style].dropna().unique())} if style else {}
    for keys, g in d.groupby([hue, style] if style else [hue]):
        g = g.sort_values(x)
        ax.plot(
            g[x].astype(float),
            g[y].astype(float),
            styles.get(keys[-1], looks[0]),
            color=colours[keys[0]],
            label=" · ".join(str(k) for k in keys),
        )


def _finish_curves(ax, x: str, y: str, log: str, labels: dict | None) -> None:
    """Log axes, texts, grid and legend of a :func:`curves` panel; lays its figure out."""
    for axis in ("x", "y"):
        if axis in log:
            _log_plain(ax, axis)
    ax.set(
        **{"xlabel": label_of(x), "ylabel": label_of(y), "title": f"{label_of(y)} vs {label_of(x)}", **(labels or {})}
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.figure.tight_layout()


def cost_vs_interactivity(
    df: pd.DataFrame,
    hue: str = "accelerator",
    x: str = "tok_s_per_stream",
    per_gpu: str = "tok_s_per_gpu",
    cost: str = "usd_per_mtok",
    title: str | None = None,
):
    """Two panels over interactivity ``x``: the Pareto front of ``per_gpu`` (:func:`kit.plan.cost.pareto_front`) and
    the cost ``cost`` ($/Mtok, log), one line per ``hue`` value. Returns the Figure.

    Raises: UserError for a missing column.
    """
    from kit.plan.cost import pareto_front

    require_columns(df, [hue, x, per_gpu, cost])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    fronts = pd.concat([pareto_front(g, x, per_gpu) for _, g in df.groupby(hue)], ignore_index=True)
    _draw_curves(a1, fronts, x, per_gpu, hue, None, _LOOKS)
    _finish_curves(a1, x, per_gpu, "", {"title": "throughput vs interactivity (Pareto front)"})
    _draw_curves(a2, df, x, cost, hue, None, _LOOKS)
    _finish_curves(a2, x, cost, "y", {"title": title or "cost vs interactivity"})
    return fig


def decode_panels(df: pd.DataFrame):
    """:func:`throughput_vs_concurrency` and :func:`tpot_vs_context` side by side. Returns the Figure."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    throughput_vs_concurrency(df, ax=a1)
    tpot_vs_context(df, ax=a2)
    return fig


#: the decode-step terms of a planner row with a stack profile, in stacking order: (column, label)
STACK_TERMS = (
    ("x_t_weights_ms", "weights (HBM, at η)"),
    ("x_t_kv_ms", "KV / state (HBM)"),
    ("x_t_compute_part_ms", "compute"),
    ("x_t_floor_attn_ms", "floor: attention/MLA"),
    ("x_t_floor_moe_ms", "floor: MoE/GEMM"),
    ("x_t_floor_norm_ms", "floor: norms"),
    ("x_t_floor_other_ms", "floor: KDA/other"),
    ("x_t_comm_lat_ms", "collectives α"),
    ("x_t_comm_bw_ms", "collectives bytes"),
    ("x_t_overhead_ms", "host/graph"),
    ("x_t_draft_ms", "draft"),
)


def stack_step_bars(
    df: pd.DataFrame, label: str = "label", published: str = "published_ms", conditions: str = "conditions"
):
    """Per row (``label``) the predicted time per output token as stacked terms (:data:`STACK_TERMS`: planner
    ``x_t_*_ms`` columns of one verify step divided by ``x_spec_accept``, the tokens it emits), with the published
    time per token (``published``, ms; NaN: no published point) as a dark bar beside it, predicted/published above,
    and the published point's ``conditions`` (framework, speculative decoding, ISL/OSL, concurrency) under the label.

    Returns: the Figure. Raises: UserError for a missing column.
    """
    cols = [c for c, _ in STACK_TERMS]
    require_columns(df, [label, published, conditions, "x_spec_accept", *cols])
    fig, ax = plt.subplots(figsize=(max(7.0, 2.3 * len(df)), 5.6))
    x = np.arange(len(df))
    per_tok = df[cols].fillna(0.0).div(df["x_spec_accept"].fillna(1.0), axis=0)
    bottom = np.zeros(len(df))
    for i, (c, name) in enumerate(STACK_TERMS):
        v = per_tok[c].to_numpy()
        if not v.any():
            continue
        ax.bar(x - 0.19, v, 0.36, bottom=bottom, color=plt.cm.tab20(i), label=name)
        bottom += v
    pub = pd.to_numeric(df[published], errors="coerce").to_numpy()
    ax.bar(x + 0.19, np.nan_to_num(pub), 0.36, color="0.15", label="published (ms per output token)")
    for j, (p, q) in enumerate(zip(bottom, pub)):
        txt = f"×{p / q:.2f}" if q > 0 else "no published\npoint"
        ax.annotate(txt, (j - 0.19, p), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{a}\n{b}" for a, b in zip(df[label], df[conditions])], fontsize=7)
    ax.set_ylabel("ms per output token (per user)")
    ax.set_title("decode: planner terms with stack profiles (left) vs published (right)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
