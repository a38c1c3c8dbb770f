"""The widgets of :class:`kit.view.panel.ControlPanel` and their layout (ipywidgets 8): built here, driven there.

Each input starts from a :class:`kit.measure.sweep.SweepConfig` field; the CSS classes (``kit-run``, ``kit-kv``,
``kit-compile`` ...) are what the browser test selects.
"""

from __future__ import annotations

from pathlib import Path

from kit import dtypes, hardware, models
from kit.measure.engine import KV_FILLS
from kit.measure.sweep import SweepConfig
from kit.view.render import PANEL_PLOTS, table_html

#: the device menu: auto-detect, or one platform of :data:`kit.hardware.PLATFORMS`
DEVICES = ("auto", *hardware.PLATFORMS)


#: panel attribute → the CSS class the browser test selects it by
CSS_CLASSES = {
    "run_button": "kit-run",
    "stop_button": "kit-stop",
    "plot": "kit-plot",
    "table": "kit-table",
    "message": "kit-message",
    "status": "kit-status",
    "kv_lens": "kit-kv",
    "concurrencies": "kit-concurrency",
    "decode_steps": "kit-decode-steps",
    "repeats": "kit-repeats",
    "warmup_steps": "kit-warmup-steps",
    "progress": "kit-progress",
    "compile": "kit-compile",
}


def build_widgets(p, c: SweepConfig, out_dir: str | Path) -> None:
    """Create the panel's widgets as attributes of ``p`` (``p.model``, ``p.kv_lens``, ``p.compile``,
    ``p.run_button`` ..., the whole view as ``p.widget``), initial values from ``c``; ``p.frame`` must exist (the
    empty table is drawn from it). No handler is attached here."""
    import ipywidgets as w

    _config_inputs(p, c, out_dir, w)
    _controls_and_outputs(p, w)
    for attr, cls in CSS_CLASSES.items():
        getattr(p, attr).add_class(cls)
    _lay_out(p, w)


def _config_inputs(p, c: SweepConfig, out_dir: str | Path, w) -> None:
    """One input per :class:`SweepConfig` field the panel sets (``w``: the ipywidgets module)."""
    lay = w.Layout(width="330px")
    style = {"description_width": "120px"}
    p.model = w.Combobox(
        value=c.model,
        options=list(models.PRESETS),
        description="model",
        placeholder="preset or checkpoint dir",
        ensure_option=False,
        layout=lay,
        style=style,
        tooltip="a preset name or a local checkpoint directory",
    )
    p.dtypes = w.SelectMultiple(
        value=tuple(dtypes.canonical(d) for d in c.dtypes),
        options=dtypes.MODEL_DTYPES,
        description="dtypes",
        rows=3,
        layout=lay,
        style=style,
    )
    p.device = w.Dropdown(value=c.device, options=DEVICES, description="device", layout=lay, style=style)
    p.kv_lens = w.Text(
        value=", ".join(map(str, c.kv_lens)),
        description="KV lengths",
        placeholder="e.g. 128, 512, 2048",
        layout=lay,
        style=style,
    )
    p.concurrencies = w.Text(
        value=", ".join(map(str, c.concurrencies)),
        description="concurrencies",
        placeholder="e.g. 1, 4, 16",
        layout=lay,
        style=style,
    )
    p.decode_steps = w.BoundedIntText(
        value=c.decode_steps, min=1, max=100000, description="decode steps", layout=lay, style=style
    )
    p.warmup_steps = w.BoundedIntText(
        value=c.warmup_steps, min=0, max=100000, description="warm-up steps", layout=lay, style=style
    )
    p.repeats = w.BoundedIntText(value=c.repeats, min=1, max=1000, description="repeats", layout=lay, style=style)
    p.kv_fill = w.Dropdown(value=c.kv_fill, options=list(KV_FILLS), description="KV fill", layout=lay, style=style)
    p.compile = w.Checkbox(
        value=bool(c.compile),
        description="torch.compile the decode steps",
        indent=False,
        layout=lay,
        tooltip="SweepConfig.compile: decode steps through torch.compile (compile time is outside the timing)",
    )
    p.out_dir = w.Text(value=str(out_dir), description="output dir", layout=lay, style=style)
    p.input_check = w.HTML(value="")


def _controls_and_outputs(p, w) -> None:
    """Run/stop, progress, status and messages, the plot and its chooser, the table, export."""
    p.run_button = w.Button(description="Run", button_style="success", icon="play")
    p.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
    p.progress = w.IntProgress(value=0, min=0, max=1, description="0/0", layout=w.Layout(width="420px"))
    p.status = w.HTML(value="idle")
    p.message = w.HTML(value="")
    p.plot_kind = w.Dropdown(
        value=list(PANEL_PLOTS)[0], options=list(PANEL_PLOTS), description="plot", layout=w.Layout(width="360px")
    )
    p.plot = w.Image(format="png", layout=w.Layout(max_width="640px", display="none"))
    p.table = w.HTML(value=table_html(p.frame))
    p.export_format = w.Dropdown(
        value="parquet", options=["parquet", "csv"], description="export", layout=w.Layout(width="220px")
    )
    p.export_button = w.Button(description="Export", icon="download")
    p.export_path = w.HTML(value="")


def _lay_out(p, w) -> None:
    """``p.widget``: the title, inputs beside the controls, then the plot chooser, the plot and the table."""
    inputs = w.VBox(
        [
            p.model,
            p.dtypes,
            p.device,
            p.kv_lens,
            p.concurrencies,
            p.decode_steps,
            p.warmup_steps,
            p.repeats,
            p.kv_fill,
            p.compile,
            p.out_dir,
            p.input_check,
        ],
        layout=w.Layout(min_width="350px", margin="0 16px 0 0"),
    )
    controls = w.VBox(
        [
            w.HBox([p.run_button, p.stop_button]),
            p.progress,
            p.status,
            p.message,
            w.HBox([p.export_format, p.export_button]),
            p.export_path,
        ]
    )
    p.widget = w.VBox(
        [
            w.HTML("<h3>kit · sweep control panel</h3>"),
            w.HBox([inputs, controls]),
            p.plot_kind,
            p.plot,
            p.table,
        ]
    )
