"""Pure renderings of results for the widgets (:mod:`kit.view.panel`, :mod:`kit.view.compare_view`) and the kit's
HTML pages: the results table and its HTML, the problem lines, PNG bytes of a figure and their data URI, and the
static snapshot shown where no widget manager runs (papermill outputs in the docs, nbconvert, a console). No widget is
built here; every function is testable on a plain DataFrame.
"""

from __future__ import annotations

import base64
import io

import pandas as pd

from kit.errors import UserError
from kit.results import HEADLINE_COLUMNS, row_problems, verdict
from kit.view.plots import heatmap, throughput_vs_concurrency, tpot_vs_context

#: columns of the results table shown in the panel (all from the kit.results schema)
TABLE_COLUMNS = ("dtype", "context_len", "concurrency", "status", *HEADLINE_COLUMNS)


def results_table(df: pd.DataFrame | None, columns=TABLE_COLUMNS) -> pd.DataFrame:
    """The rows the panel shows: one per point, sorted by dtype, KV length and concurrency, rounded to 3 decimals.

    The ``status`` column shows each row's verdict (:func:`kit.results.verdict`): a row with status ok and a
    problem flag (non-finite logits) reads ``flagged``, never ``ok``. Columns of ``columns`` missing from ``df`` are
    left out; an empty or None ``df`` gives an empty frame with ``columns``.
    """
    if df is None or df.empty:
        return pd.DataFrame(columns=list(columns))
    if "status" in df.columns:
        df = df.assign(status=verdict(df))
    cols = [c for c in columns if c in df.columns]
    t = df[cols].sort_values([c for c in ("dtype", "context_len", "concurrency") if c in cols]).reset_index(drop=True)
    return t.round(3)


def table_html(df: pd.DataFrame | None, css_class: str = "kit-results") -> str:
    """HTML ``<table class=css_class>`` of :func:`results_table` (the panel shows it; the browser test reads it);
    a ``<p>`` saying so when there is no finished point yet."""
    t = results_table(df)
    if t.empty:
        return f"<p class='{css_class}-empty'>no finished points yet</p>"
    style = (
        f"<style>table.{css_class} td, table.{css_class} th {{padding: 2px 10px; text-align: right;}}"
        f" table.{css_class} tbody tr:nth-child(odd) {{background: #f4f4f4;}}</style>"
    )
    return style + t.to_html(index=False, classes=css_class, na_rep="-", border=0)


def _present(value) -> bool:
    """True for a real value; False for None / NaN / NA."""
    if value is None:
        return False
    try:
        return not bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or array: present
        return True


def point_problems(df: pd.DataFrame | None) -> list[str]:
    """One line per point that is not a clean measurement, led by its verdict (:func:`kit.results.verdict`): status
    oom or error, a problem flag (``flagged``: :func:`kit.results.row_problems`, e.g. non-finite logits), or an ok
    row with an ``error`` text (``note``); e.g. ``"oom: float32 kv=32 B=2: CUDA out of memory"``. A line never
    starts with ``ok``."""
    out: list[str] = []
    if df is None or df.empty:
        return out
    verdicts = verdict(df) if "status" in df.columns else pd.Series(None, index=df.index, dtype=object)
    for i, r in df.iterrows():
        err = r.get("error")
        why = ([str(err)] if _present(err) else []) + [p for p in row_problems(r) if not _present(err)]
        if r.get("status") != "ok" or why:
            lead = "note" if verdicts.loc[i] == "ok" else verdicts.loc[i]
            what = f"{lead}: {r.get('dtype')} kv={r.get('context_len')} B={r.get('concurrency')}"
            out.append(f"{what}: {'; '.join(why)}" if why else what)
    return out


def figure_png(fig, dpi: int = 90) -> bytes:
    """PNG bytes of a matplotlib figure (``dpi`` dots per inch); the figure is closed, so a notebook does not draw
    it a second time."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return buf.getvalue()


def png_data_uri(png: bytes) -> str:
    """``png`` bytes as a ``data:image/png;base64,...`` URI: a figure inlined in a self-contained HTML page."""
    return "data:image/png;base64," + base64.b64encode(bytes(png)).decode()


def snapshot_html(status_html: str, png, table: str) -> str:
    """A static HTML picture of a widget view: the status line, the plot (``png`` bytes inlined; skipped when
    empty or None) and the table's HTML."""
    parts = [f"<div class='kit-snapshot'><div>{status_html}</div>"]
    data = bytes(png) if png is not None else b""
    if data:
        parts.append(f"<img alt='plot' style='max-width:640px' src='{png_data_uri(data)}'/>")
    parts.append(f"{table}</div>")
    return "".join(parts)


def widget_bundle(widget, text: str, html_snapshot: str) -> dict:
    """The MIME bundle of a kit view: the live widget (ipywidgets' view), plus ``text`` as text/plain and
    ``html_snapshot`` as text/html for places without a widget manager."""
    data = dict(widget._repr_mimebundle_())
    data["text/plain"] = text
    data["text/html"] = html_snapshot
    return data


#: the plot menu: label → (figure function of :mod:`kit.view.plots`, y column)
PANEL_PLOTS = {
    "decode tok/s vs concurrency": (throughput_vs_concurrency, "decode_tok_s"),
    "TPOT vs KV-cache length": (tpot_vs_context, "tpot_ms_p50"),
    "decode tok/s heatmap": (heatmap, "decode_tok_s"),
    "tok/s per stream vs concurrency": (throughput_vs_concurrency, "tok_s_per_stream"),
}


def panel_plot(df: pd.DataFrame | None, kind: str = "decode tok/s vs concurrency", label: str | None = None):
    """The Figure of menu entry ``kind`` (:data:`PANEL_PLOTS`) for ``df``, drawn by :mod:`kit.view.plots`; None when
    there is no row to draw.

    Several dtypes in ``df`` are told apart by line style (``label="dtype"`` unless given); the heatmap shows the
    first dtype (its last row per grid cell).

    Raises: UserError (a ValueError) for an unknown ``kind``, listing the allowed ones.
    """
    if kind not in PANEL_PLOTS:
        raise UserError(f"plot kind {kind!r}; allowed: {list(PANEL_PLOTS)}")
    if df is None or df.empty:
        return None
    fn, y = PANEL_PLOTS[kind]
    if fn is heatmap:
        first = df["dtype"].dropna().iloc[0] if "dtype" in df and df["dtype"].notna().any() else None
        sub = df if first is None else df[df["dtype"] == first]
        return heatmap(sub.drop_duplicates(["context_len", "concurrency"], keep="last"), value=y)
    if label is None and "dtype" in df.columns and df["dtype"].nunique() > 1:
        label = "dtype"
    return fn(df, y=y, label=label)
