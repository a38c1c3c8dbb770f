"""Figures from results DataFrames: columns are picked by name, every function returns a matplotlib Figure.

Points that are not ok (:func:`kit.results.ok_mask`: status oom or error, or a problem flag such as non-finite
logits) are drawn, not dropped: a red ``x`` on the x position at the bottom of the axes (line plots) or a hatched
cell labelled with the verdict, e.g. "OOM" or "FLAGGED" (heatmap). Several result sets (devices, dtypes, runs)
share axes when ``label`` names a column that tells them apart: one line style per label value.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kit.errors import UserError
from kit.results import ok_mask, verdict

_LABELS = {
    "decode_tok_s": "decode throughput (tok/s, all streams)",
    "tok_s_per_stream": "interactivity (tok/s per stream)",
    "tpot_ms_p50": "TPOT p50 (ms)",
    "tpot_ms_p90": "TPOT p90 (ms)",
    "ttft_ms": "TTFT = prefill (ms)",
    "prefill_ms": "prefill (ms)",
    "prefill_tok_s": "prefill throughput (tok/s)",
    "concurrency": "concurrency (batch size)",
    "context_len": "KV-cache length (tokens)",
    "peak_mem_gb": "peak memory (GB)",
    "kv_cache_gb": "KV cache (GB)",
    "achieved_gb_s": "achieved bandwidth (GB/s)",
    "output_tok_s": "output throughput (tok/s)",
    "usd_per_mtok": "$ per million tokens",
    "tok_s_per_gpu": "tok/s/GPU",
    "tok_s_per_user": "tok/s/user",
}
_STYLES = ["-", "--", ":", "-."]


def label_of(col: str) -> str:
    """Axis label for a column name (units included)."""
    return _LABELS.get(col, col)


def require_columns(df: pd.DataFrame, cols) -> None:
    """Raise UserError naming the columns of ``cols`` (None entries ignored) that ``df`` lacks (or naming ``df`` when
    it is not a DataFrame)."""
    if not isinstance(df, pd.DataFrame):
        raise UserError(f"df={type(df).__name__}: give the results as a pandas DataFrame (kit.load(out_dir))")
    missing = [c for c in cols if c and c not in df.columns]
    if missing:
        raise UserError(f"column(s) {missing} not in the results; available: {list(df.columns)}")


def line_plot(
    df: pd.DataFrame,
    x: str,
    y: str | tuple[str, str],
    hue: str,
    label: str | None = None,
    ax=None,
    log: str = "x",
    title: str | None = None,
):
    """One line of ``y`` over ``x`` per value of ``hue`` (and per ``label`` value, by line style); points that are
    not ok are red ``x`` marks at the bottom of the axes.

    Args:
        y: the column drawn, or a pair ``(column, upper)``: the line is ``column``, shaded up to ``upper`` (e.g.
            ``("tpot_ms_p50", "tpot_ms_p90")``).
        log: the axes on a log scale: ``"x"`` (default; base 2, ticks at the x values), ``"xy"``, ``"y"`` or ``""``
            (a log y is skipped when no value is positive).
        ax: draw into this matplotlib Axes (default: a new figure). title: default ``"<y> vs <x>"``.

    Returns: the Figure. Raises: UserError (a ValueError) for a missing column.
    """
    y, band = (y, None) if isinstance(y, str) else y
    require_columns(df, [x, y, hue, label, band])
    fig = ax.figure if ax is not None else plt.figure(figsize=(6.4, 4.2))
    ax = ax or fig.add_subplot(111)
    groups = [(None, df)] if label is None else list(df.groupby(label, sort=True))
    hues = sorted(df[hue].dropna().unique())
    cmap = plt.get_cmap("viridis", max(len(hues), 2))
    bad_any = False
    for gi, (lab, gdf) in enumerate(groups):
        for hi, h in enumerate(hues):
            sub = gdf[gdf[hue] == h].sort_values(x)
            name = f"{label_of(hue).split(' (')[0]} {h}" + (f" · {lab}" if lab is not None else "")
            bad_any |= _draw_line(ax, sub, x, (y, band), _STYLES[gi % len(_STYLES)], cmap(hi), name)
    if bad_any:
        ax.plot([], [], "x", color="red", mew=2, label="OOM / error (not measured)")
    if "x" in log:
        ax.set_xscale("log", base=2)
        xs = sorted(df[x].dropna().unique())
        ax.set_xticks(xs)
        ax.set_xticklabels([str(int(v)) if float(v).is_integer() else str(v) for v in xs])
    if "y" in log and (pd.to_numeric(df[y], errors="coerce") > 0).any():  # log of nothing positive cannot be drawn
        ax.set_yscale("log")
    ax.set_xlabel(label_of(x))
    ax.set_ylabel(label_of(y))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"{label_of(y).split(' (')[0]} vs {label_of(x).split(' (')[0]}")
    fig.tight_layout()
    return fig


def _draw_line(ax, sub: pd.DataFrame, x: str, y_band: tuple[str, str | None], style: str, color, name: str) -> bool:
    """Draw the ok rows of ``sub`` as one line (shaded up to the band column, if any) and its other rows as red
    ``x`` marks at the bottom of the axes; True when there were such rows."""
    y, band = y_band
    good = ok_mask(sub) if "status" in sub else pd.Series(True, index=sub.index)
    ok = sub[good]
    if len(ok):
        ax.plot(ok[x], ok[y], style, marker="o", color=color, label=name)
        if band is not None:
            ax.fill_between(ok[x].astype(float), ok[y].astype(float), ok[band].astype(float), color=color, alpha=0.15)
    bad = sub[~good]
    if len(bad):
        ax.plot(
            bad[x], [0.0] * len(bad), "x", color="red", markersize=10, mew=2, transform=ax.get_xaxis_transform(),
            clip_on=False,
        )  # fmt: skip
    return bool(len(bad))


def throughput_vs_concurrency(df: pd.DataFrame, y: str = "decode_tok_s", label: str | None = None, ax=None):
    """Decode tok/s vs concurrency, one line per KV length (rises with concurrency until compute-bound)."""
    return line_plot(
        df,
        "concurrency",
        y,
        "context_len",
        label=label,
        ax=ax,
        log="xy",
        title=_title(df, "decode throughput vs concurrency"),
    )


def tpot_vs_context(df: pd.DataFrame, y: str = "tpot_ms_p50", label: str | None = None, ax=None):
    """TPOT p50 vs KV length, one line per concurrency, shaded up to p90 (rises with KV length)."""
    require_columns(df, ())
    band = "tpot_ms_p90" if y == "tpot_ms_p50" and "tpot_ms_p90" in df.columns else None
    return line_plot(
        df,
        "context_len",
        y if band is None else (y, band),
        "concurrency",
        label=label,
        ax=ax,
        title=_title(df, "TPOT vs KV-cache length" + (" (band: p50 to p90)" if band else "")),
    )


def heatmap(
    df: pd.DataFrame,
    value: str = "decode_tok_s",
    x: str = "concurrency",
    y: str = "context_len",
    ax=None,
    fmt: str = "{:.0f}",
):
    """Heatmap of ``value`` over the (y, x) grid; cells that are not ok hatched and labelled with their verdict
    (:func:`kit.results.verdict`: OOM, ERROR, FLAGGED).

    Raises: ValueError for a missing column or duplicate (x, y) points (filter to one model/dtype first).
    """
    require_columns(df, [value, x, y])
    if df.duplicated([x, y]).any():
        raise UserError(f"several rows per ({y}, {x}); filter to one model/dtype/run before a heatmap")
    xs, ys = sorted(df[x].unique()), sorted(df[y].unique())
    grid = np.full((len(ys), len(xs)), np.nan)
    status = {}
    df = df.assign(_verdict=verdict(df)) if "status" in df else df.assign(_verdict="ok")
    for _, r in df.iterrows():
        i, j = ys.index(r[y]), xs.index(r[x])
        st = r["_verdict"]
        status[(i, j)] = st
        if st == "ok":
            grid[i, j] = r[value]
    fig = ax.figure if ax is not None else plt.figure(figsize=(6.4, 4.2))
    ax = ax or fig.add_subplot(111)
    im = ax.imshow(np.ma.masked_invalid(grid), origin="lower", aspect="auto", cmap="viridis")
    for (i, j), st in status.items():
        if st != "ok":
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="xx", edgecolor="red"))
            ax.text(j, i, st.upper(), ha="center", va="center", color="red", fontsize=9, fontweight="bold")
        else:
            v = grid[i, j]
            ax.text(
                j,
                i,
                fmt.format(v),
                ha="center",
                va="center",
                fontsize=8,
                color="white" if v < np.nanmean(grid) else "black",
            )
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(label_of(x))
    ax.set_ylabel(label_of(y))
    fig.colorbar(im, ax=ax, label=label_of(value))
    ax.set_title(_title(df, f"{label_of(value).split(' (')[0]} over the grid"))
    fig.tight_layout()
    return fig


def _title(df: pd.DataFrame, what: str) -> str:
    require_columns(df, ())
    parts = []
    for col in ("model", "dtype", "device_name"):
        if col in df.columns:
            vals = df[col].dropna().unique()
            if len(vals) == 1:
                parts.append(str(vals[0]))
    return what + (f"\n{' · '.join(parts)}" if parts else "")


def save_standard_plots(df: pd.DataFrame, out_dir: str | Path, prefix: str = "") -> list[Path]:
    """Write the three standard plots per dtype into ``out_dir``: ``{prefix}throughput_vs_concurrency[_DTYPE].png``,
    ``{prefix}tpot_vs_context[_DTYPE].png``, ``{prefix}heatmap_decode_tok_s[_DTYPE].png`` (the dtype suffix only
    when ``df`` holds several dtypes). ``prefix`` (e.g. ``"tiny-llama_"``) keeps the plots of several models or runs
    in one directory apart. Each PNG is written atomically (:func:`kit.view.files.save_figure`). Returns the paths.

    Raises: UserError for a prefix with a path separator or a space; OutputPathError (one line naming the path)
    when a file cannot be written.
    """
    from kit.view.files import check_prefix, save_figure

    check_prefix(prefix)
    out = Path(out_dir)
    paths = []
    dtypes = df["dtype"].dropna().unique()
    for dt in dtypes:
        sub = df[df["dtype"] == dt]
        suffix = f"_{dt}" if len(dtypes) > 1 else ""
        for name, fn in (
            ("throughput_vs_concurrency", throughput_vs_concurrency),
            ("tpot_vs_context", tpot_vs_context),
            ("heatmap_decode_tok_s", heatmap),
        ):
            paths.append(save_figure(fn(sub), out / f"{prefix}{name}{suffix}.png", dpi=110))
    return paths


# ---------------------------------------------------------------- the compare view, the how-to notebooks
def compare_plot(df: pd.DataFrame, y: str = "decode_tok_s", x: str = "concurrency", hue: str = "context_len"):
    """Shared axes for labelled result sets (a :func:`kit.view.compare_view.compare_frame` result): one line style
    per ``label``, one colour per ``hue``; log y for throughput and cost columns. Returns the Figure.

    Raises: UserError (a ValueError) for a missing column.
    """
    require_columns(df, ["label"])
    log = "xy" if y in ("decode_tok_s", "usd_per_mtok", "tok_per_usd") else "x"
    return line_plot(
        df,
        x,
        y,
        hue,
        label="label",
        log=log,
        title=f"{label_of(y).split(' (')[0]} vs {x}: {' vs '.join(map(str, df['label'].unique()))}",
    )


def dtype_plot(df: pd.DataFrame, y: str = "decode_tok_s"):
    """Decode tok/s vs concurrency per dtype (line style) and KV length (colour). A point whose logits were
    non-finite (``x_logits_finite`` False) measured broken arithmetic: it is drawn as not measured (red x), never
    as a speed. Returns the Figure."""
    return line_plot(
        df,
        "concurrency",
        y,
        "context_len",
        label="dtype",
        log="xy",
        title=_title(df, f"{label_of(y).split(' (')[0]} by dtype (x: non-finite logits or not measured)"),
    )


def knee_plot(df: pd.DataFrame, knee: pd.DataFrame, y: str = "decode_tok_s"):
    """:func:`throughput_vs_concurrency` with a dotted vertical line and a note at each knee that was reached.

    Args:
        knee: rows of :func:`kit.view.analysis.concurrency_knee` (context_len, knee, reached, y_at_knee).

    Returns: the Figure. Raises: UserError (a ValueError) for a missing column.
    """
    require_columns(knee, ["context_len", "knee", "reached", "y_at_knee"])
    fig = throughput_vs_concurrency(df, y=y)
    ax = fig.axes[0]
    for _, k in knee[knee["reached"].astype(bool)].iterrows():
        b = int(k["knee"])
        ax.axvline(b, color="grey", ls=":", lw=1)
        ax.annotate(
            f"knee kv={int(k['context_len'])}: B={b}",
            (b, k["y_at_knee"]),
            fontsize=8,
            textcoords="offset points",
            xytext=(4, -12),
        )
    return fig


# ---------------------------------------------------------------- served sweeps (rows of kit.serve.load)
def _throughput_col(df):
    """Served rows: output_tok_s; in-process rows: decode_tok_s (both output tokens per second)."""
    return df["output_tok_s"].where(df["backend"] == "openai", df["decode_tok_s"]).astype("float64")


def plot_served(df, title: str | None = None):
    """Figure with two panels: output tok/s vs concurrency, and the Pareto curve tok/s/GPU vs tok/s/user.

    ``df``: rows of the shared schema (served rows use ``output_tok_s``; in-process ``engine`` rows use
    ``decode_tok_s``), grouped by ``backend`` (and ``model``, and the server configuration ``x_server_config`` of a
    ``--server-grid``: one line per configuration on the same axes). tok/s/GPU divides by ``n_gpus`` (1 when
    missing); tok/s/user is ``tok_s_per_stream`` (1000 / median TPOT). Only ok rows (:func:`kit.results.ok_mask`)
    are drawn as speeds; the rows left out (oom, error, flagged) are counted in the figure's title.

    Returns: a matplotlib Figure.
    """
    from matplotlib.ticker import NullFormatter

    from kit import metrics as M

    require_columns(df, ())
    from kit import results as R

    df = R.coerce(df)
    good = ok_mask(df)
    left_out = verdict(df[~good]).value_counts() if (~good).any() else pd.Series(dtype=int)
    df = df[good].copy()  # a flagged row (kit.results.ok_mask) is no speed
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    df["_tok_s"] = _throughput_col(df)
    df["_per_gpu"] = M.tok_s_per_gpu(df["_tok_s"], df["n_gpus"].fillna(1).astype("float64"))
    server = df["x_server_config"].fillna("") if "x_server_config" in df else pd.Series("", index=df.index)
    for (backend, model, config), g in df.groupby([df["backend"], df["model"].fillna("?"), server], sort=False):
        g = g.sort_values("concurrency")
        label = f"{backend}: {Path(str(model)).name}" + (f" [{config}]" if config and config != "default" else "")
        a1.plot(g["concurrency"].astype(float), g["_tok_s"], marker="o", label=label)
        a2.plot(g["tok_s_per_stream"], g["_per_gpu"], marker="o", label=label)
        for _, r in g.iterrows():
            a2.annotate(
                str(r["concurrency"]),
                (r["tok_s_per_stream"], r["_per_gpu"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
    a1.set_xscale("log", base=2)
    concs = sorted({int(c) for c in df["concurrency"].dropna()})
    if concs:
        a1.set_xticks(concs, [str(c) for c in concs])
        a1.xaxis.set_minor_formatter(NullFormatter())
    a1.set_xlabel("concurrency (requests in flight / batch)")
    a1.set_ylabel("output tok/s (served) | decode tok/s (in-process)")
    a1.set_title("throughput vs concurrency")
    a2.set_xlabel("tok/s per user (1000 / TPOT p50)")
    a2.set_ylabel("tok/s per GPU")
    a2.set_title("throughput vs interactivity (labels: concurrency)")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    if len(left_out):
        note = "not drawn: " + ", ".join(f"{n} {v}" for v, n in left_out.items())
        title = f"{title}\n{note}" if title else note
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def value_grids(values: dict, title: str = "fp8 E4M3 grids: same shape, shifted by one binade"):
    """Each number format's representable positive values as a row of ``|`` marks on a log2 axis (e.g.
    ``{fmt: kit.check.fp8.positive_values(fmt)}``): shows where two formats' grids differ. Returns the Figure."""
    if not values:
        raise UserError("values is empty; give {format name: 1-d array of its positive values}")
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.85 * len(values)))
    for i, vals in enumerate(values.values()):
        v = np.asarray(vals, dtype=float)
        ax.scatter(v, [i] * v.size, s=80, marker="|")
    ax.set_xscale("log", base=2)
    ax.set_yticks(range(len(values)), list(values))
    ax.set_ylim(-0.6, len(values) - 0.4)
    ax.set(xlabel="representable positive value (log2 scale)", title=title)
    fig.tight_layout()
    return fig
