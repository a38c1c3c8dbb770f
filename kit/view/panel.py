"""Interactive exploration in Jupyter or Voilà: a sweep control panel and a compare view (ipywidgets 8).

Both are thin layers over :func:`kit.measure.sweep.run_sweep` and :mod:`kit.view.plots`; every decision lives in plain
methods that tests drive without a browser (set a widget's ``.value``, call the handler, assert on state)::

    from kit.view.panel import ControlPanel
    panel = ControlPanel(out_dir="results/panel")
    panel            # displays the panel in a notebook

:class:`ControlPanel`
    Inputs: model preset, dtype(s), device, KV lengths and concurrencies (editable comma lists, checked as you
    type), decode steps, repeats, KV fill mode, output directory. **Run** validates everything first (a bad value
    is shown in the panel's message area, nothing runs) and then sweeps point by point; after each finished point
    the progress bar, the plot and the results table are redrawn. **Stop** ends the sweep after the point that is
    running; every finished point is kept (they are appended to ``out_dir/points.jsonl`` as they finish). OOM and
    error points, and points whose logits were non-finite, are listed in the message area. **Export** writes the
    results as Parquet or CSV. In a notebook the sweep runs in a background thread (``threaded=True``) so the Stop
    button stays responsive while the kernel is busy measuring.

:class:`CompareView`
    Loads two or more result sets (run directories or Parquet files), labels them, and draws them on shared axes
    (one line style per set); adds $ per million tokens from the catalog's price for each set's accelerator, or
    from a price you type in. The pure function behind it is :func:`compare_frame`.
"""
from __future__ import annotations

import html
import io
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import pandas as pd

from kit.dtypes import MODEL_DTYPES
from kit.errors import OutputPathError, UserError
from kit import models
from kit.cli import parse_int_list
from kit.measure.engine import KV_FILLS
from kit.results import load_results

#: columns of the results table shown in the panel (all from the kit.results schema)
TABLE_COLUMNS = ("dtype", "context_len", "concurrency", "status", "ttft_ms", "tpot_ms_p50", "tpot_ms_p90",
                 "tpot_n", "decode_tok_s", "tok_s_per_stream", "peak_mem_gb")
#: plot choices: label → (function name in kit.view.plots, y column)
PLOTS = {
    "decode tok/s vs concurrency": ("throughput_vs_concurrency", "decode_tok_s"),
    "TPOT vs KV-cache length": ("tpot_vs_context", "tpot_ms_p50"),
    "decode tok/s heatmap": ("heatmap", "decode_tok_s"),
    "tok/s per stream vs concurrency": ("throughput_vs_concurrency", "tok_s_per_stream"),
}
DEVICES = ("auto", "cpu", "cuda", "rocm")


def results_table(df: pd.DataFrame, columns=TABLE_COLUMNS) -> pd.DataFrame:
    """The rows the panel shows: one per point, sorted by dtype, KV length and concurrency, rounded for reading."""
    if df is None or df.empty:
        return pd.DataFrame(columns=list(columns))
    cols = [c for c in columns if c in df.columns]
    t = df[cols].sort_values([c for c in ("dtype", "context_len", "concurrency") if c in cols]).reset_index(drop=True)
    return t.round(3)


def table_html(df: pd.DataFrame, css_class: str = "kit-results") -> str:
    """HTML ``<table class=css_class>`` of :func:`results_table` (used by the panel and the browser test)."""
    t = results_table(df)
    if t.empty:
        return f"<p class='{css_class}-empty'>no finished points yet</p>"
    style = (f"<style>table.{css_class} td, table.{css_class} th {{padding: 2px 10px; text-align: right;}}"
             f" table.{css_class} tbody tr:nth-child(odd) {{background: #f4f4f4;}}</style>")
    return style + t.to_html(index=False, classes=css_class, na_rep="-", border=0)


def figure_png(fig, dpi: int = 90) -> bytes:
    """PNG bytes of a matplotlib figure; the figure is closed (so notebooks do not draw it a second time)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return buf.getvalue()


def plot_png(df: pd.DataFrame, kind: str = "decode tok/s vs concurrency", label: str | None = None) -> bytes | None:
    """Draw one of :data:`PLOTS` for ``df`` and return PNG bytes (None when there is nothing to draw).

    Several dtypes in ``df`` are told apart by line style (``label="dtype"``); the heatmap shows the first dtype.

    Raises: ValueError for an unknown ``kind`` (lists the allowed ones).
    """
    from kit.view import plots

    if kind not in PLOTS:
        raise UserError(f"plot kind {kind!r}; allowed: {list(PLOTS)}")
    if df is None or df.empty:
        return None
    fn_name, y = PLOTS[kind]
    fn = getattr(plots, fn_name)
    if fn_name == "heatmap":
        first = df["dtype"].dropna().iloc[0] if "dtype" in df and df["dtype"].notna().any() else None
        sub = df if first is None else df[df["dtype"] == first]
        return figure_png(fn(sub.drop_duplicates(["context_len", "concurrency"], keep="last"), value=y))
    if label is None and "dtype" in df.columns and df["dtype"].nunique() > 1:
        label = "dtype"
    return figure_png(fn(df, y=y, label=label))


def point_problems(df: pd.DataFrame) -> list[str]:
    """One line per point that is not a clean measurement: OOM, error, or non-finite logits (status ok + error)."""
    out = []
    if df is None or df.empty:
        return out
    for _, r in df.iterrows():
        err = r.get("error")
        has_err = err is not None and not (isinstance(err, float) and pd.isna(err)) and not pd.isna(err)
        if r.get("status") != "ok" or has_err:
            out.append(f"{r.get('status')}: {r.get('dtype')} kv={r.get('context_len')} B={r.get('concurrency')}: "
                       f"{err if has_err else ''}".rstrip(": "))
    return out


def snapshot_html(status_html: str, png, table: str) -> str:
    """A static HTML picture of a panel: status line, the plot (inline PNG) and the table."""
    import base64

    parts = [f"<div class='kit-snapshot'><div>{status_html}</div>"]
    data = bytes(png) if png is not None else b""
    if data:
        parts.append(f"<img alt='plot' style='max-width:640px' src='data:image/png;base64,"
                     f"{base64.b64encode(data).decode()}'/>")
    parts.append(f"{table}</div>")
    return "".join(parts)


def _bundle(widget, text: str, html_snapshot: str) -> dict:
    data = dict(widget._repr_mimebundle_())
    data["text/plain"] = text
    data["text/html"] = html_snapshot
    return data


class ControlPanel:
    """A sweep control panel (see the module docstring). Display it by leaving it as a cell's last expression.

    Args:
        out_dir: where the sweep writes (``points.jsonl``, ``results.parquet`` …); editable in the panel.
        model, dtypes, kv_lens, concurrencies, decode_steps, repeats, kv_fill, device: initial widget values.
        threaded: run the sweep in a background thread (notebooks, Voilà) so Stop stays responsive; tests pass
            False and call the handlers directly.
        runner: passed to :func:`kit.measure.sweep.run_sweep` (tests inject slow or failing points here).

    Each press of Run writes a new run directory ``out_dir/run-YYYYmmdd-HHMMSS`` (attribute ``run_dir``), so
    runs never mix; load one later with ``kit.results.load_results(run_dir)``.

    Attributes (state that tests assert on): ``frame`` (results so far), ``state`` ("idle", "running",
    "stopping", "stopped", "done", "failed"), ``messages`` (lines shown in the message area), ``last_error``.
    """

    def __init__(self, out_dir: str | Path = "results/panel", *, model: str = models.DEFAULT_PRESET,
                 dtypes=("float32",), kv_lens=(128, 512), concurrencies=(1, 4), decode_steps: int = 8,
                 repeats: int = 2, warmup_steps: int = 2, kv_fill: str = "prefill", device: str = "auto",
                 threaded: bool = True, runner: Callable | None = None):
        import ipywidgets as w

        self.threaded = threaded
        self.runner = runner
        self.run_dir: Path | None = None
        self.frame = pd.DataFrame()
        self.state = "idle"
        self.messages: list[str] = []
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

        lay = w.Layout(width="330px")
        style = {"description_width": "120px"}
        self.model = w.Combobox(value=model, options=list(models.PRESETS), description="model",
                                placeholder="preset or checkpoint dir", ensure_option=False, layout=lay, style=style,
                                tooltip="a preset name or a local checkpoint directory")
        self.dtypes = w.SelectMultiple(value=tuple(dtypes), options=MODEL_DTYPES, description="dtypes", rows=3,
                                       layout=lay, style=style)
        self.device = w.Dropdown(value=device, options=DEVICES, description="device", layout=lay, style=style)
        self.kv_lens = w.Text(value=", ".join(map(str, kv_lens)), description="KV lengths",
                              placeholder="e.g. 128, 512, 2048", layout=lay, style=style)
        self.concurrencies = w.Text(value=", ".join(map(str, concurrencies)), description="concurrencies",
                                    placeholder="e.g. 1, 4, 16", layout=lay, style=style)
        self.decode_steps = w.BoundedIntText(value=decode_steps, min=1, max=100000, description="decode steps",
                                             layout=lay, style=style)
        self.warmup_steps = w.BoundedIntText(value=warmup_steps, min=0, max=100000, description="warm-up steps",
                                             layout=lay, style=style)
        self.repeats = w.BoundedIntText(value=repeats, min=1, max=1000, description="repeats", layout=lay,
                                        style=style)
        self.kv_fill = w.Dropdown(value=kv_fill, options=list(KV_FILLS), description="KV fill", layout=lay,
                                  style=style)
        self.out_dir = w.Text(value=str(out_dir), description="output dir", layout=lay, style=style)
        self.input_check = w.HTML(value="")
        self.run_button = w.Button(description="Run", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.progress = w.IntProgress(value=0, min=0, max=1, description="0/0", layout=w.Layout(width="420px"))
        self.status = w.HTML(value="idle")
        self.message = w.HTML(value="")
        self.plot_kind = w.Dropdown(value=list(PLOTS)[0], options=list(PLOTS), description="plot",
                                    layout=w.Layout(width="360px"))
        self.plot = w.Image(format="png", layout=w.Layout(max_width="640px", display="none"))
        self.table = w.HTML(value=table_html(self.frame))
        self.export_format = w.Dropdown(value="parquet", options=["parquet", "csv"], description="export",
                                        layout=w.Layout(width="220px"))
        self.export_button = w.Button(description="Export", icon="download")
        self.export_path = w.HTML(value="")
        for widget, cls in ((self.run_button, "kit-run"), (self.stop_button, "kit-stop"), (self.plot, "kit-plot"),
                            (self.table, "kit-table"), (self.message, "kit-message"), (self.status, "kit-status"),
                            (self.kv_lens, "kit-kv"), (self.concurrencies, "kit-concurrency"),
                            (self.decode_steps, "kit-decode-steps"), (self.repeats, "kit-repeats"),
                            (self.warmup_steps, "kit-warmup-steps"), (self.progress, "kit-progress")):
            widget.add_class(cls)

        self.run_button.on_click(self.on_run)
        self.stop_button.on_click(self.on_stop)
        self.export_button.on_click(self.on_export)
        self.plot_kind.observe(lambda _c: self.redraw(), names="value")
        for widget in (self.kv_lens, self.concurrencies, self.model, self.dtypes):
            widget.observe(lambda _c: self.check_inputs(), names="value")

        inputs = w.VBox([self.model, self.dtypes, self.device, self.kv_lens, self.concurrencies, self.decode_steps,
                         self.warmup_steps, self.repeats, self.kv_fill, self.out_dir, self.input_check],
                        layout=w.Layout(min_width="350px", margin="0 16px 0 0"))
        controls = w.VBox([w.HBox([self.run_button, self.stop_button]), self.progress, self.status, self.message,
                           w.HBox([self.export_format, self.export_button]), self.export_path])
        self.widget = w.VBox([w.HTML("<h3>kit · sweep control panel</h3>"), w.HBox([inputs, controls]),
                              self.plot_kind, self.plot, self.table])
        self.check_inputs()

    # ----------------------------------------------------------------- display
    def _repr_mimebundle_(self, **kwargs):
        """The live widget, plus a static HTML snapshot and a text summary for places without a widget manager
        (papermill outputs rendered in the docs, nbconvert, a plain console)."""
        return _bundle(self.widget, self.summary(), snapshot_html(self.status.value, self.plot.value,
                                                                 self.table.value))

    def summary(self) -> str:
        """One line: state, points finished, run directory."""
        return (f"kit ControlPanel: {self.state}, {len(self.frame)} point(s)"
                + (f" in {self.run_dir}" if self.run_dir else "") + " (interactive in JupyterLab / kit dashboard)")

    # ----------------------------------------------------------------- inputs
    def check_inputs(self) -> list[str]:
        """Validate the typed lists and the model name as the user edits; show problems under the inputs.

        Returns the problems (empty when the inputs parse)."""
        problems = []
        for widget, name in ((self.kv_lens, "KV lengths"), (self.concurrencies, "concurrencies")):
            try:
                parse_int_list(widget.value, name)
            except ValueError as e:
                problems.append(str(e))
        if not self.dtypes.value:
            problems.append("dtypes: select at least one")
        name = self.model.value.strip()
        if name not in models.PRESETS and not models.is_checkpoint_dir(name):
            problems.append(f"model: {name!r} is neither a preset ({', '.join(models.PRESETS)}) nor a checkpoint "
                            "directory with config.json")
        self.input_check.value = "".join(f"<div style='color:#b00'>⚠ {html.escape(p, quote=False)}</div>"
                                         for p in problems)
        return problems

    def config(self):
        """The :class:`kit.measure.sweep.SweepConfig` the widgets describe, validated.

        Raises: ValueError naming the bad value (from :func:`parse_int_list` or ``SweepConfig.validate``).
        """
        from kit.measure.sweep import SweepConfig

        cfg = SweepConfig(model=self.model.value.strip(), dtypes=list(self.dtypes.value), device=self.device.value,
                          kv_lens=parse_int_list(self.kv_lens.value, "KV lengths"),
                          concurrencies=parse_int_list(self.concurrencies.value, "concurrencies"),
                          decode_steps=int(self.decode_steps.value), warmup_steps=int(self.warmup_steps.value),
                          repeats=int(self.repeats.value), kv_fill=self.kv_fill.value)
        return cfg.validate()

    # ----------------------------------------------------------------- handlers
    def on_run(self, _button=None) -> None:
        """Run handler: validate, then sweep (in a thread when ``threaded``). Bad input → message, state "failed"."""
        if self.state in ("running", "stopping"):
            self._say("a sweep is already running; press Stop first", error=True)
            return
        self.messages = []
        self.last_error = None
        try:
            cfg = self.config()
            out = Path(self.out_dir.value.strip() or "results/panel")
            if out.exists() and not out.is_dir():
                raise OutputPathError(f"output dir {str(out)!r} exists and is a file; give a directory")
            stamp = time.strftime("run-%Y%m%d-%H%M%S")
            run_dir, k = out / stamp, 1
            while run_dir.exists():
                k += 1
                run_dir = out / f"{stamp}-{k}"
        except (ValueError, KeyError, NotADirectoryError) as e:
            self.state = "failed"
            self.last_error = str(e.args[0] if isinstance(e, KeyError) and e.args else e)
            self.status.value = "<b style='color:#b00'>not started: fix the input</b>"
            self._say(self.last_error, error=True)
            return
        n = len(cfg.points())
        self._stop.clear()
        self.frame = pd.DataFrame()
        self.progress.max, self.progress.value, self.progress.description = n, 0, f"0/{n}"
        self.progress.bar_style = "info"
        self.state = "running"
        self.status.value = f"running {n} points…"
        self.run_button.disabled, self.stop_button.disabled = True, False
        self.table.value = table_html(self.frame)
        self.plot.value = b""
        self.plot.layout.display = "none"
        self._t0 = time.perf_counter()
        self.run_dir = run_dir
        if self.threaded:
            self._thread = threading.Thread(target=self._sweep, args=(cfg, run_dir), daemon=True, name="kit-panel")
            self._thread.start()
        else:
            self._sweep(cfg, run_dir)

    def on_stop(self, _button=None) -> None:
        """Stop handler: the sweep ends after the point that is running; finished points are kept."""
        if self.state != "running":
            return
        self._stop.set()
        self.state = "stopping"
        self.status.value = "stopping after the current point…"
        self.stop_button.disabled = True

    def on_point(self, record: dict, frame: pd.DataFrame) -> None:
        """Called by run_sweep after each finished point: progress, plot, table and problem list redrawn."""
        self.frame = frame
        self.progress.value = min(self.progress.value + 1, self.progress.max)
        self.progress.description = f"{self.progress.value}/{self.progress.max}"
        el = time.perf_counter() - self._t0
        self.status.value = (f"{self.state}: {self.progress.value}/{self.progress.max} points in {el:.1f} s · last: "
                             f"{record.get('dtype')} kv={record.get('context_len')} B={record.get('concurrency')} "
                             f"→ {record.get('status')}")
        probs = point_problems(pd.DataFrame([record]))
        for p in probs:
            self._say(p, error=True)
        self.redraw()

    def on_export(self, _button=None) -> Path | None:
        """Export handler: write the results as ``run_dir/export.parquet`` or ``export.csv``; returns the path."""
        from kit.results import save_results

        if self.frame.empty:
            self._say("nothing to export yet: run a sweep first", error=True)
            return None
        out = self.run_dir or Path(self.out_dir.value.strip() or "results/panel")
        try:
            if self.export_format.value == "csv":
                out.mkdir(parents=True, exist_ok=True)
                path = out / "export.csv"
                from kit.view.analysis import LIST_COLUMNS  # per-step lists do not fit a CSV cell

                self.frame.drop(columns=list(LIST_COLUMNS), errors="ignore").to_csv(path, index=False)
            else:
                path = save_results(self.frame, out / "export.parquet",
                                    metadata=self.frame.attrs.get("metadata", {}))
        except OSError as e:
            self._say(f"export failed: {e}", error=True)
            return None
        self.export_path.value = f"wrote <code>{html.escape(str(path))}</code>"
        return path

    # ----------------------------------------------------------------- internals
    def redraw(self) -> None:
        """Redraw the plot and the table from ``self.frame``."""
        try:
            png = plot_png(self.frame, self.plot_kind.value)
        except Exception as e:  # a plot problem must not end the sweep
            self._say(f"plot failed: {type(e).__name__}: {e}", error=True)
            png = None
        self.plot.value = png or b""
        self.plot.layout.display = None if png else "none"  # no broken-image icon while empty
        self.table.value = table_html(self.frame)

    def _say(self, text: str, error: bool = False) -> None:
        self.messages.append(text)
        color = "#b00" if error else "#333"
        self.message.value = "".join(f"<div style='color:{color}'>{html.escape(m, quote=False)}</div>"
                                     for m in self.messages[-12:])

    def _sweep(self, cfg, out: Path) -> None:
        from kit.measure.sweep import run_sweep

        try:
            df = run_sweep(cfg, out, resume=False, progress=False, on_point=self.on_point,
                           should_stop=self._stop.is_set, runner=self.runner)
            self.frame = df
            self.redraw()
            stopped = self._stop.is_set()
            self.state = "stopped" if stopped else "done"
            el = time.perf_counter() - self._t0
            n_ok = int((df["status"] == "ok").sum()) if not df.empty else 0
            self.status.value = (f"<b>{'stopped' if stopped else 'done'}</b>: {len(df)} points "
                                 f"({n_ok} ok) in {el:.1f} s → <code>{html.escape(str(out))}</code>")
            self.progress.bar_style = "warning" if stopped else "success"
        except Exception as e:  # shown in the panel, never a silent dead button
            self.state = "failed"
            self.last_error = f"{type(e).__name__}: {e}"
            self.status.value = "<b style='color:#b00'>failed</b>"
            self._say(self.last_error, error=True)
            self._say(traceback.format_exc(limit=3))
            self.progress.bar_style = "danger"
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True

    def wait(self, timeout_s: float = 600.0) -> str:
        """Block until a threaded sweep ends; returns the final state. Raises TimeoutError."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError(f"sweep still running after {timeout_s} s")
        return self.state


# ==================================================================================================== compare
def compare_frame(sets: dict[str, pd.DataFrame], prices: dict[str, float] | None = None,
                  basis: str | None = None, tok_s_col: str = "decode_tok_s") -> pd.DataFrame:
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
        ValueError: no sets, a price <= 0, or an unknown ``tok_s_col``.
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
        price = prices.get(lab)
        # a row without a price (no accelerator, or none on this basis): cost unknown, speed still compared
        parts.append(add_cost_columns(d, basis=basis, usd_per_gpu_hr=price, tok_s_col=tok_s_col, catalog=cat,
                                      missing_price="nan"))
    return pd.concat(parts, ignore_index=True)


def load_sets(paths: dict[str, str | Path]) -> dict[str, pd.DataFrame]:
    """label → results, loaded with :func:`kit.results.load_results` (run directory or Parquet file)."""
    return {lab: load_results(p) for lab, p in paths.items()}


def compare_plot(df: pd.DataFrame, y: str = "decode_tok_s", x: str = "concurrency", hue: str = "context_len"):
    """Shared-axes plot of a :func:`compare_frame` result: one line style per ``label``. Returns the Figure."""
    from kit.view.plots import line_plot

    logy = y in ("decode_tok_s", "usd_per_mtok", "tok_per_usd")
    return line_plot(df, x, y, hue, label="label", logy=logy,
                     title=f"{y} vs {x}: {' vs '.join(df['label'].unique())}")


def compare_summary(df: pd.DataFrame, by=("label", "context_len", "concurrency")) -> pd.DataFrame:
    """Side-by-side table of speed and cost per (label, KV length, concurrency), ok points only."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    cols = [c for c in ("decode_tok_s", "tpot_ms_p50", "usd_per_gpu_hr", "usd_per_mtok", "tok_per_usd") if c in ok]
    return ok[list(by) + cols].sort_values(list(by)).reset_index(drop=True).round(4)


class CompareView:
    """Widgets over :func:`compare_frame`: one row per result set (path, label, optional $/GPU-hour).

    Args:
        paths: label → run directory or Parquet file, pre-filled (more rows can be added with "+ set").
    """

    def __init__(self, paths: dict[str, str | Path] | None = None):
        import ipywidgets as w

        self._w = w
        self.rows: list[tuple] = []
        self.rows_box = w.VBox([])
        self.add_button = w.Button(description="+ set", icon="plus")
        self.compare_button = w.Button(description="Compare", button_style="primary")
        self.y = w.Dropdown(options=["decode_tok_s", "tok_s_per_stream", "tpot_ms_p50", "usd_per_mtok",
                                     "tok_per_usd"], value="decode_tok_s", description="y")
        self.basis = w.Dropdown(options=["tco", "assumed-rental", "on-demand"], value="tco",
                                description="price basis")
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
        self.widget = w.VBox([w.HTML("<h3>kit · compare result sets</h3>"), self.rows_box,
                              w.HBox([self.add_button, self.basis, self.y, self.compare_button]), self.message,
                              self.plot, self.table])

    def _repr_mimebundle_(self, **kwargs):
        """The live widget, plus a static HTML snapshot (plot + table) and a text summary."""
        labels = ", ".join(sorted(self.frame["label"].unique())) if not self.frame.empty else "nothing compared yet"
        return _bundle(self.widget, f"kit CompareView: {labels}",
                       snapshot_html(self.message.value, self.plot.value, self.table.value))

    def add_row(self, path: str = "", label: str = ""):
        """Add an input row (path, label, $/GPU-hour; 0 = use the catalog)."""
        w = self._w
        row = (w.Text(value=path, description="results", placeholder="run dir or .parquet"),
               w.Text(value=label, description="label", layout=w.Layout(width="220px")),
               w.FloatText(value=0.0, description="$/GPU-h", layout=w.Layout(width="200px")))
        self.rows.append(row)
        self.rows_box.children = [w.HBox(list(r)) for r in self.rows]
        return row

    def on_compare(self, _button=None) -> None:
        """Compare handler: load every filled row, build the frame, draw; problems go to the message area."""
        self.last_error = None
        try:
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
            self.frame = compare_frame(load_sets(paths), prices, basis=self.basis.value)
        except (ValueError, KeyError, FileNotFoundError, OSError) as e:
            self.last_error = str(e)
            self.message.value = f"<div style='color:#b00'>{html.escape(self.last_error, quote=False)}</div>"
            return
        unpriced = sorted(self.frame[self.frame["usd_per_gpu_hr"].isna()]["label"].unique())
        note = (f"no catalog price on basis {self.basis.value!r} for: {', '.join(unpriced)}; type a $/GPU-h"
                if unpriced else "")
        self.message.value = html.escape(note)
        self.redraw()

    def redraw(self) -> None:
        if self.frame.empty:
            return
        self.plot.value = figure_png(compare_plot(self.frame, y=self.y.value))
        self.table.value = compare_summary(self.frame).to_html(index=False, border=0, na_rep="-",
                                                               classes="kit-compare")


__all__ = ["ControlPanel", "CompareView", "compare_frame", "compare_plot", "compare_summary", "load_sets",
           "parse_int_list", "results_table", "table_html", "plot_png", "point_problems", "figure_png"]
