"""Compare result sets on speed and cost: the pure logic (:func:`compare_frame`, :func:`compare_summary`,
:func:`load_sets`) and a widget view over it (:class:`CompareView`, ipywidgets 8).

Loads two or more result sets (run directories or Parquet files), labels them, and draws them on shared axes (one
line style per set, :func:`kit.view.plots.compare_plot`); adds $ per million tokens from the catalog's price for
each set's accelerator, or from a price you type in::

    from kit.view.compare_view import CompareView
    CompareView({"MI355X": "results/mi355x", "B300": "results/b300"})
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from kit.errors import KitError, UserError
from kit.results import ok_mask
from kit.store import load_results
from kit.view.render import figure_png, snapshot_html, widget_bundle

#: what the view's y menu offers (columns of :func:`compare_frame`)
Y_CHOICES = ("decode_tok_s", "tok_s_per_stream", "tpot_ms_p50", "usd_per_mtok", "tok_per_usd")


def compare_frame(
    sets: dict[str, pd.DataFrame],
    prices: dict[str, float] | None = None,
    basis: str | None = None,
    tok_s_col: str = "decode_tok_s",
) -> pd.DataFrame:
    """Concatenate labelled result sets and add cost columns, ready for plotting on shared axes.

    Args:
        sets: label → results DataFrame (kit.results schema). Each label becomes the ``label`` column.
        prices: label → $/GPU-hour typed by the user (wins over the catalog; ``price_basis`` = "user").
        basis: catalog price basis for sets without a user price (default: the catalog's ``tco``); the
            accelerator is each row's ``accelerator`` column. Sets with no price get NaN cost columns.
        tok_s_col: throughput behind the cost (decode_tok_s in-process; output_tok_s for served runs).

    Returns:
        One frame with ``label`` and the cost columns of :func:`kit.plan.cost.add_cost_columns` (usd_per_gpu_hr,
        price_basis, tok_s_per_gpu, usd_per_mtok, tok_per_usd, tok_s_basis; formulas in :mod:`kit.metrics`).

    Raises:
            UserError (a ValueError): no sets, a price <= 0, or an unknown ``tok_s_col``.
    """
    from kit.catalog import DEFAULT_BASIS, load_catalog
    from kit.plan.cost import add_cost_columns

    if not sets:
        raise UserError("give at least one result set to compare")
    prices = dict(prices or {})
    for lab, p in prices.items():
        if p is not None and not float(p) > 0:
            raise UserError(f"price for {lab!r} is {p!r}; a $/GPU-hour must be > 0")
    basis = basis or DEFAULT_BASIS
    cat = load_catalog()
    parts = []
    for lab, df in sets.items():
        d = df.copy()
        d["label"] = str(lab)
        # a row without a price (no accelerator, or none on this basis): cost unknown, speed still compared
        parts.append(
            add_cost_columns(
                d, basis=basis, usd_per_gpu_hr=prices.get(lab), tok_s_col=tok_s_col, catalog=cat, missing_price="nan"
            )
        )
    return pd.concat(parts, ignore_index=True)


def load_sets(paths: dict[str, str | Path]) -> dict[str, pd.DataFrame]:
    """label → results, loaded with :func:`kit.store.load_results` (run directory or Parquet file).

    Raises: InputNotFoundError (a FileNotFoundError) for a path with no results.
    """
    return {lab: load_results(p) for lab, p in paths.items()}


def compare_summary(df: pd.DataFrame, by=("label", "context_len", "concurrency")) -> pd.DataFrame:
    """Side-by-side table of speed (decode tok/s, TPOT p50 ms) and cost ($/GPU-hour, $/Mtok, tok/$) per
    (label, KV length, concurrency), ok points only (:func:`kit.results.ok_mask`: a flagged row is left out),
    rounded to 4 decimals."""
    ok = df[ok_mask(df)] if "status" in df else df
    cols = [c for c in ("decode_tok_s", "tpot_ms_p50", "usd_per_gpu_hr", "usd_per_mtok", "tok_per_usd") if c in ok]
    return ok[list(by) + cols].sort_values(list(by)).reset_index(drop=True).round(4)


class CompareView:
    """Widgets over :func:`compare_frame`: one row per result set (path, label, optional $/GPU-hour).

    Args:
        paths: label → run directory or Parquet file, pre-filled (more rows can be added with "+ set").

    Attributes (state tests assert on): ``rows`` (the input rows: path, label, price widgets), ``frame`` (the
    compared frame), ``last_error`` (the message shown, or None).
    """

    def __init__(self, paths: dict[str, str | Path] | None = None):
        import ipywidgets as w

        from kit.catalog import DEFAULT_BASIS, load_catalog

        self._w = w
        self.rows: list[tuple] = []
        self.rows_box = w.VBox([])
        self.add_button = w.Button(description="+ set", icon="plus")
        self.compare_button = w.Button(description="Compare", button_style="primary")
        self.y = w.Dropdown(options=list(Y_CHOICES), value=Y_CHOICES[0], description="y")
        bases = sorted(load_catalog().prices["basis"].dropna().unique())
        self.basis = w.Dropdown(options=bases, value=DEFAULT_BASIS, description="price basis")
        self.message = w.HTML()
        self.plot = w.Image(format="png", layout=w.Layout(max_width="640px"))
        self.table = w.HTML()
        self.frame = pd.DataFrame()
        self.last_error: str | None = None
        self.add_button.on_click(lambda _b: self.add_row())
        self.compare_button.on_click(self.on_compare)
        self.y.observe(lambda _c: self.redraw(), names="value")
        for lab, p in (paths or {}).items():
            self.add_row(str(p), lab)
        if not self.rows:
            self.add_row()
            self.add_row()
        self.widget = w.VBox(
            [
                w.HTML("<h3>kit · compare result sets</h3>"),
                self.rows_box,
                w.HBox([self.add_button, self.basis, self.y, self.compare_button]),
                self.message,
                self.plot,
                self.table,
            ]
        )

    def _repr_mimebundle_(self, **kwargs):
        """The live widget, plus a static HTML snapshot (plot + table) and a text summary."""
        labels = ", ".join(sorted(self.frame["label"].unique())) if not self.frame.empty else "nothing compared yet"
        return widget_bundle(
            self.widget,
            f"kit CompareView: {labels}",
            snapshot_html(self.message.value, self.plot.value, self.table.value),
        )

    def add_row(self, path: str = "", label: str = ""):
        """Add an input row (path, label, $/GPU-hour; 0 = use the catalog); returns its three widgets."""
        w = self._w
        row = (
            w.Text(value=path, description="results", placeholder="run dir or .parquet"),
            w.Text(value=label, description="label", layout=w.Layout(width="220px")),
            w.FloatText(value=0.0, description="$/GPU-h", layout=w.Layout(width="200px")),
        )
        self.rows.append(row)
        self.rows_box.children = [w.HBox(list(r)) for r in self.rows]
        return row

    def inputs(self) -> tuple[dict[str, str], dict[str, float]]:
        """(label → path, label → $/GPU-hour) from the filled rows; an unlabelled row is "set N".

        Raises: UserError (a ValueError): a label used twice, or fewer than two filled rows.
        """
        paths, prices = {}, {}
        for i, (p, lab, price) in enumerate(self.rows):
            if not p.value.strip():
                continue
            name = lab.value.strip() or f"set {i + 1}"
            if name in paths:
                raise UserError(f"label {name!r} is used twice; labels must differ")
            paths[name] = p.value.strip()
            if price.value:
                prices[name] = float(price.value)
        if len(paths) < 2:
            raise UserError("fill in at least two result sets to compare")
        return paths, prices

    def on_compare(self, _button=None) -> None:
        """Compare handler: load every filled row, build the frame, draw; problems go to the message area."""
        self.last_error = None
        try:
            paths, prices = self.inputs()
            self.frame = compare_frame(load_sets(paths), prices, basis=self.basis.value)
        except (KitError, ValueError, OSError) as e:  # user input: a bad row, a missing or unreadable set
            self.last_error = str(e)
            self.message.value = f"<div style='color:#b00'>{html.escape(self.last_error, quote=False)}</div>"
            return
        unpriced = sorted(self.frame[self.frame["usd_per_gpu_hr"].isna()]["label"].unique())
        note = (
            f"no catalog price on basis {self.basis.value!r} for: {', '.join(unpriced)}; type a $/GPU-h"
            if unpriced
            else ""
        )
        self.message.value = html.escape(note)
        self.redraw()

    def redraw(self) -> None:
        """Redraw the plot (:func:`kit.view.plots.compare_plot` of the chosen y) and the summary table."""
        from kit.view.plots import compare_plot

        if self.frame.empty:
            return
        self.plot.value = figure_png(compare_plot(self.frame, y=self.y.value))
        self.table.value = compare_summary(self.frame).to_html(index=False, border=0, na_rep="-", classes="kit-compare")
