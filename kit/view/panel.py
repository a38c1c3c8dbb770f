"""A sweep control panel for Jupyter or Voilà (ipywidgets 8): a thin layer over :func:`kit.measure.sweep.run_sweep`
and :mod:`kit.view.plots`.

Every decision lives in plain methods that tests drive without a browser (set a widget's ``.value``, call the
handler, assert on state)::

    from kit.view.panel import ControlPanel
    panel = ControlPanel(out_dir="results/panel")                 # every initial value from SweepConfig()
    panel = ControlPanel(out_dir="results/panel", kv_lens=[16])   # or any SweepConfig field overridden
    panel            # displays the panel in a notebook

Inputs: model preset, dtype(s), device, KV lengths and concurrencies (editable comma lists, checked as you type),
decode steps, warm-up steps, repeats, KV fill mode, torch.compile (``SweepConfig.compile``), output directory.
**Run** validates everything first (a bad value is shown in the panel's message area, nothing runs) and then sweeps
point by point; after each finished point the progress bar, the plot (:func:`panel_plot`: a figure of
:mod:`kit.view.plots`) and the results table are redrawn. **Stop** ends the sweep after the point that is running;
every finished point is kept (they are appended to ``run_dir/points.jsonl`` as they finish). OOM and error points,
and flagged points (status ok with a problem flag such as non-finite logits; the table shows them as ``flagged``),
are listed in the message area. **Export** writes the results as Parquet or CSV. In a notebook the sweep runs in a
background thread (``threaded=True``) so the Stop button stays responsive while the kernel is busy measuring. The
compare view is :class:`kit.view.compare_view.CompareView`.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from kit import models
from kit._io import check_out_dir
from kit.cli import parse_int_list
from kit.errors import KitError
from kit.measure.sweep import SweepConfig
from kit.results import ok_mask, verdict
from kit.view.panel_widgets import build_widgets
from kit.view.render import (
    figure_png,
    panel_plot,
    point_problems,
    snapshot_html,
    table_html,
    widget_bundle,
)

log = logging.getLogger("kit")

#: output directory when the box is left empty
PANEL_OUT = "results/panel"


class ControlPanel:
    """A sweep control panel (see the module docstring). Display it by leaving it as a cell's last expression.

    Args:
        out_dir: where each Run writes its run directory; editable in the panel.
        config: the initial settings (default ``SweepConfig()``: the one source of the panel's defaults).
        threaded: run the sweep in a background thread (notebooks, Voilà) so Stop stays responsive; tests pass
            False and call the handlers directly.
        runner: passed to :func:`kit.measure.sweep.run_sweep` (tests inject slow or failing points here).
        settings: :class:`kit.measure.sweep.SweepConfig` fields overriding ``config`` (``kv_lens=[16, 64]``);
            an unknown name raises TypeError. Fields without a widget (seed, accelerator, threads) are kept as
            given and passed to every Run.

    Each press of Run writes a new run directory ``out_dir/run-YYYYmmdd-HHMMSS`` (attribute ``run_dir``), so
    runs never mix; load one later with ``kit.store.load_results(run_dir)``.

    Attributes (state that tests assert on): ``initial`` (the SweepConfig the widgets started from), ``frame``
    (results so far), ``state`` ("idle", "running", "stopping", "stopped", "done", "failed"), ``messages`` (lines
    shown in the message area), ``last_error``.
    """

    def __init__(
        self,
        out_dir: str | Path = PANEL_OUT,
        config: SweepConfig | None = None,
        *,
        threaded: bool = True,
        runner: Callable | None = None,
        **settings,
    ):
        self.initial = dataclasses.replace(config if config is not None else SweepConfig(), **settings)
        c = self.initial
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

        build_widgets(self, c, out_dir)
        self.run_button.on_click(self.on_run)
        self.stop_button.on_click(self.on_stop)
        self.export_button.on_click(self.on_export)
        self.plot_kind.observe(lambda _c: self.redraw(), names="value")
        for widget in (self.kv_lens, self.concurrencies, self.model, self.dtypes):
            widget.observe(lambda _c: self.check_inputs(), names="value")

        self.check_inputs()

    # ----------------------------------------------------------------- display
    def _repr_mimebundle_(self, **kwargs):
        """The live widget, plus a static HTML snapshot and a text summary for places without a widget manager
        (papermill outputs rendered in the docs, nbconvert, a plain console)."""
        return widget_bundle(
            self.widget, self.summary(), snapshot_html(self.status.value, self.plot.value, self.table.value)
        )

    def summary(self) -> str:
        """One line: state, points finished, run directory."""
        return (
            f"kit ControlPanel: {self.state}, {len(self.frame)} point(s)"
            + (f" in {self.run_dir}" if self.run_dir else "")
            + " (interactive in JupyterLab / kit dashboard)"
        )

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
            problems.append(
                f"model: {name!r} is neither a preset ({', '.join(models.PRESETS)}) nor a checkpoint "
                "directory with config.json"
            )
        self.input_check.value = "".join(
            f"<div style='color:#b00'>⚠ {html.escape(p, quote=False)}</div>" for p in problems
        )
        return problems

    def config(self) -> SweepConfig:
        """The :class:`kit.measure.sweep.SweepConfig` the widgets describe (fields without a widget from
        ``initial``), validated.

        Raises: UserError (a ValueError) naming the bad value (from :func:`kit.cli.parse_int_list` or
        ``SweepConfig.validate``).
        """
        cfg = dataclasses.replace(
            self.initial,
            model=self.model.value.strip(),
            dtypes=list(self.dtypes.value),
            device=self.device.value,
            kv_lens=parse_int_list(self.kv_lens.value, "KV lengths"),
            concurrencies=parse_int_list(self.concurrencies.value, "concurrencies"),
            decode_steps=int(self.decode_steps.value),
            warmup_steps=int(self.warmup_steps.value),
            repeats=int(self.repeats.value),
            kv_fill=self.kv_fill.value,
            compile=bool(self.compile.value),
        )
        return cfg.validate()

    def next_run_dir(self) -> Path:
        """A new ``run-YYYYmmdd-HHMMSS[-k]`` directory name under the output directory (not created).

        Raises: OutputPathError when the output directory (or a parent) is a file.
        """
        out = check_out_dir(self.out_dir.value.strip() or PANEL_OUT, "output dir")
        stamp = time.strftime("run-%Y%m%d-%H%M%S")
        run_dir, k = out / stamp, 1
        while run_dir.exists():
            k += 1
            run_dir = out / f"{stamp}-{k}"
        return run_dir

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
            run_dir = self.next_run_dir()
        except (KitError, ValueError) as e:  # the user's input; a bug elsewhere keeps its traceback
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
        self.status.value = (
            f"{self.state}: {self.progress.value}/{self.progress.max} points in {el:.1f} s · last: "
            f"{record.get('dtype')} kv={record.get('context_len')} B={record.get('concurrency')} "
            f"→ {verdict(pd.DataFrame([record])).iloc[0] if 'status' in record else None}"
        )
        for p in point_problems(pd.DataFrame([record])):
            self._say(p, error=True)
        self.redraw()

    def on_export(self, _button=None) -> Path | None:
        """Export handler: write the results as ``run_dir/export.parquet`` or ``export.csv``; returns the path
        (None when there is nothing to export or the write failed; the message area says why)."""
        from kit._io import atomic_write_with
        from kit.store import save_results
        from kit.view.analysis import LIST_COLUMNS, export_frame  # per-step lists do not fit a CSV cell

        if self.frame.empty:
            self._say("nothing to export yet: run a sweep first", error=True)
            return None
        out = self.run_dir or Path(self.out_dir.value.strip() or PANEL_OUT)
        rows = export_frame(self.frame)  # status = verdict: a flagged row reads flagged in the file
        try:
            if self.export_format.value == "csv":
                flat = rows.drop(columns=list(LIST_COLUMNS), errors="ignore")
                path = atomic_write_with(out / "export.csv", lambda tmp: flat.to_csv(tmp, index=False))
            else:
                path = save_results(rows, out / "export.parquet", metadata=self.frame.attrs.get("metadata", {}))
        except (OSError, KitError) as e:  # one line naming the path
            self._say(f"export failed: {e}", error=True)
            return None
        self.export_path.value = f"wrote <code>{html.escape(str(path))}</code>"
        return path

    # ----------------------------------------------------------------- internals
    def redraw(self) -> None:
        """Redraw the plot (:func:`kit.view.render.panel_plot` of the chosen kind) and the table from ``frame``."""
        try:
            fig = panel_plot(self.frame, self.plot_kind.value)
            png = figure_png(fig) if fig is not None else None
        except Exception as e:  # a plot problem must not end the sweep; it is shown and logged with its traceback
            log.exception("panel plot failed")
            self._say(f"plot failed: {type(e).__name__}: {e}", error=True)
            png = None
        self.plot.value = png or b""
        self.plot.layout.display = None if png else "none"  # no broken-image icon while empty
        self.table.value = table_html(self.frame)

    def _say(self, text: str, error: bool = False) -> None:
        self.messages.append(text)
        color = "#b00" if error else "#333"
        self.message.value = "".join(
            f"<div style='color:{color}'>{html.escape(m, quote=False)}</div>" for m in self.messages[-12:]
        )

    def _sweep(self, cfg: SweepConfig, out: Path) -> None:
        from kit.measure.sweep import run_sweep

        try:
            df = run_sweep(
                cfg,
                out,
                resume=False,
                progress=False,
                on_point=self.on_point,
                should_stop=self._stop.is_set,
                runner=self.runner,
            )
            self.frame = df
            self.redraw()
            stopped = self._stop.is_set()
            self.state = "stopped" if stopped else "done"
            el = time.perf_counter() - self._t0
            good = ok_mask(df) if not df.empty else pd.Series([], dtype=bool)
            n_flagged = int((verdict(df) == "flagged").sum()) if not df.empty else 0
            self.status.value = (
                f"<b>{'stopped' if stopped else 'done'}</b>: {len(df)} points "
                f"({int(good.sum())} ok{f', {n_flagged} flagged' if n_flagged else ''}) in {el:.1f} s → "
                f"<code>{html.escape(str(out))}</code>"
            )
            self.progress.bar_style = "warning" if stopped else "success"
        except Exception as e:  # shown in the panel (a background thread has no one to raise to), never a dead button
            log.exception("panel sweep failed")
            self.state = "failed"
            self.last_error = f"{type(e).__name__}: {e}"
            self.status.value = "<b style='color:#b00'>failed</b>"
            self._say(self.last_error, error=True)
            self._say(traceback.format_exc(limit=3))
            self.progress.bar_style = "danger"
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True

    def wait(self, timeout_s: float = 600.0) -> str:
        """Block until a threaded sweep ends; returns the final state. Raises TimeoutError after ``timeout_s``."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError(f"sweep still running after {timeout_s} s")
        return self.state
