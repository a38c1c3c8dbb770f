"""The control panel and compare view, driven without a browser: set ``.value``, call the handlers, assert on state.

(``Button.click()`` swallows handler exceptions, so these tests call the handlers themselves.)
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pandas as pd
import pytest
import torch

from kit.cli import parse_int_list
from kit.measure.engine import run_point
from kit.measure.sweep import SweepConfig
from kit.store import load_results
from kit.view.panel import ControlPanel
from kit.view.render import PANEL_PLOTS, panel_plot, point_problems, results_table

PNG = b"\x89PNG"


def small_panel(tmp_path, **kw):
    p = ControlPanel(out_dir=tmp_path / "panel", threaded=kw.pop("threaded", False), **kw)
    p.kv_lens.value = "16, 32"
    p.concurrencies.value = "1,2"
    p.decode_steps.value = 2
    p.warmup_steps.value = 1
    p.repeats.value = 1
    p.device.value = "cpu"
    return p


def test_panel_defaults_are_sweep_config_defaults(tmp_path):
    """One source of defaults: every initial widget value is SweepConfig()'s; overrides are SweepConfig fields."""
    d = SweepConfig()
    p = ControlPanel(out_dir=tmp_path / "p", threaded=False)
    assert p.initial == d
    assert p.model.value == d.model and list(p.dtypes.value) == d.dtypes and p.device.value == d.device
    assert parse_int_list(p.kv_lens.value) == d.kv_lens and parse_int_list(p.concurrencies.value) == d.concurrencies
    assert (p.decode_steps.value, p.warmup_steps.value, p.repeats.value, p.kv_fill.value) == (
        d.decode_steps,
        d.warmup_steps,
        d.repeats,
        d.kv_fill,
    )
    cfg = p.config()
    for f in dataclasses.fields(SweepConfig):
        if f.name != "accelerator":  # validate() resolves it against the catalog
            assert getattr(cfg, f.name) == getattr(d, f.name), f.name
    # a field without a widget is carried into every run's config; an unknown name is refused
    q = ControlPanel(out_dir=tmp_path / "q", threaded=False, kv_lens=[16], threads=1, dtypes=["bf16"])
    assert q.kv_lens.value == "16" and q.dtypes.value == ("bfloat16",) and q.config().threads == 1
    with pytest.raises(TypeError):
        ControlPanel(out_dir=tmp_path / "r", threaded=False, kv_len=[16])


def test_out_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    p = small_panel(tmp_path)
    p.out_dir.value = str(tmp_path / "file")
    p.on_run()
    assert p.state == "failed" and "is a file" in p.last_error and p.run_dir is None


def test_parse_int_list():
    assert parse_int_list("128, 512 2048") == [128, 512, 2048]
    assert parse_int_list("4,4,1") == [4, 1]
    for bad, frag in (("", "at least one"), ("1, x", "'x'"), ("0", "0 must be >= 1"), ("2.5", "'2.5'")):
        with pytest.raises(ValueError, match=frag):
            parse_int_list(bad, "KV lengths")


def test_panel_runs_2x2_sweep_through_handlers(tmp_path):
    p = small_panel(tmp_path)
    assert p.check_inputs() == []
    p.on_run()
    assert p.state == "done", p.messages
    assert p.progress.max == 4 and p.progress.value == 4 and p.progress.description == "4/4"
    df = p.frame
    assert len(df) == 4 and set(df["status"]) == {"ok"}
    assert sorted(zip(df["context_len"], df["concurrency"])) == [(16, 1), (16, 2), (32, 1), (32, 2)]
    assert p.plot.value.tobytes().startswith(PNG)
    assert p.table.value.count("<tr") == 5  # header + 4 rows
    assert "kit-results" in p.table.value
    # the run directory holds every point, loadable
    assert p.run_dir.parent == tmp_path / "panel"
    assert len(load_results(p.run_dir)) == 4
    assert not p.run_button.disabled and p.stop_button.disabled
    # every plot kind draws
    for kind in ("TPOT vs KV-cache length", "decode tok/s heatmap", "tok/s per stream vs concurrency"):
        p.plot_kind.value = kind
        assert p.plot.value.tobytes().startswith(PNG), kind
    # export both formats
    p.export_format.value = "csv"
    path = p.on_export()
    assert path.name == "export.csv" and len(pd.read_csv(path)) == 4
    p.export_format.value = "parquet"
    path = p.on_export()
    assert path.name == "export.parquet" and len(pd.read_parquet(path)) == 4
    # a second Run writes a new run directory; runs never mix
    first = p.run_dir
    p.on_run()
    assert p.run_dir != first and len(p.frame) == 4


def test_bad_input_shows_in_panel_and_runs_nothing(tmp_path):
    p = small_panel(tmp_path)
    p.kv_lens.value = "16, abc"
    assert "'abc'" in p.input_check.value  # shown as you type
    p.on_run()
    assert p.state == "failed" and "'abc'" in p.last_error and "'abc'" in p.message.value
    assert not (tmp_path / "panel").exists()
    assert not p.run_button.disabled
    p.kv_lens.value = "16"
    p.model.value = "no-such-model"
    assert "no-such-model" in p.input_check.value
    p.on_run()
    assert p.state == "failed" and "no-such-model" in p.message.value
    p.model.value = "tiny-llama"
    p.kv_lens.value = "100000"  # beyond the model's positions
    p.on_run()
    assert p.state == "failed" and "100000" in p.message.value
    p.kv_lens.value = "16"
    p.dtypes.value = ()
    assert "select at least one" in p.input_check.value
    p.on_run()
    assert p.state == "failed"


def test_stop_mid_sweep_keeps_finished_points(tmp_path):
    p = small_panel(tmp_path)
    calls = []

    def runner(model, point, device, seed):
        calls.append(point)
        if len(calls) == 2:
            p.on_stop()  # pressed while the 2nd point runs
            assert p.state == "stopping"
        return run_point(model, point, device, seed)

    p.runner = runner
    p.on_run()
    assert p.state == "stopped"
    assert len(calls) == 2 and len(p.frame) == 2 and set(p.frame["status"]) == {"ok"}
    assert p.progress.value == 2 and p.progress.max == 4
    lines = (p.run_dir / "points.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["status"] == "ok" for x in lines)
    assert "stopped" in p.status.value


def test_threaded_stop_while_kernel_busy(tmp_path):
    p = small_panel(tmp_path, threaded=True)
    started = threading.Event()

    def runner(model, point, device, seed):
        started.set()
        time.sleep(0.3)
        return run_point(model, point, device, seed)

    p.runner = runner
    p.on_run()
    assert started.wait(30)
    p.on_stop()
    assert p.wait(60) == "stopped"
    assert 1 <= len(p.frame) < 4
    assert len(load_results(p.run_dir)) == len(p.frame)


def test_oom_and_error_points_are_listed(tmp_path):
    p = small_panel(tmp_path)

    def runner(model, point, device, seed):
        if point.concurrency == 2 and point.context_len == 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if point.concurrency == 2:
            raise RuntimeError("boom")
        return run_point(model, point, device, seed)

    p.runner = runner
    p.on_run()
    assert p.state == "done"
    assert sorted(p.frame["status"]) == ["error", "ok", "ok", "oom"]
    assert "oom: float32 kv=32 B=2" in p.message.value and "boom" in p.message.value
    assert p.plot.value.tobytes().startswith(PNG)  # OOM points are drawn (red x), the plot still renders


def test_sweep_failure_shows_in_panel(tmp_path):
    p = small_panel(tmp_path)

    def on_point(*a):
        raise OSError("disk full")

    p.on_point = on_point
    p.on_run()
    assert p.state == "failed" and "disk full" in p.last_error and "disk full" in p.message.value
    assert not p.run_button.disabled


def test_non_finite_logits_flagged():
    df = pd.DataFrame(
        [
            {
                "status": "ok",
                "dtype": "float16",
                "context_len": 16,
                "concurrency": 1,
                "error": "non-finite logits in the last decode step",
            },
            {"status": "ok", "dtype": "float32", "context_len": 16, "concurrency": 1, "error": None},
        ]
    )
    probs = point_problems(df)
    assert len(probs) == 1 and "float16" in probs[0] and "non-finite" in probs[0]
    assert results_table(pd.DataFrame()).empty and panel_plot(pd.DataFrame()) is None
    with pytest.raises(ValueError, match="allowed"):
        panel_plot(df, "pie chart")


def plot_frame() -> pd.DataFrame:
    """A 2 x 3 grid, the largest point OOM (as kit.results rows)."""
    from kit import results

    rows = [
        {
            "backend": "engine",
            "status": "oom" if (kv, b) == (512, 16) else "ok",
            "model": "tiny-llama",
            "dtype": "float32",
            "context_len": kv,
            "concurrency": b,
            "tpot_ms_p50": 2 + kv / 256 + b / 8,
            "tpot_ms_p90": 3 + kv / 256 + b / 8,
            "decode_tok_s": b * 100.0,
            "tok_s_per_stream": 100.0,
        }
        for kv in (128, 512)
        for b in (1, 4, 16)
    ]
    return results.to_frame(rows)


def test_panel_plot_every_kind_and_errors():
    df = plot_frame()
    for kind in PANEL_PLOTS:
        fig = panel_plot(df, kind)
        assert fig.axes, kind
    assert panel_plot(pd.DataFrame()) is None and panel_plot(None) is None
    with pytest.raises(ValueError, match="allowed"):
        panel_plot(df, "pie chart")
    # several dtypes: told apart by line style; the heatmap takes the first dtype only (one row per cell)
    b = plot_frame()
    b["dtype"] = "bfloat16"
    both = pd.concat([df, b], ignore_index=True)
    lines = [ln.get_label() for ln in panel_plot(both).axes[0].get_lines()]
    assert any("bfloat16" in name for name in lines) and any("float32" in name for name in lines)
    assert len(panel_plot(both, "decode tok/s heatmap").axes[0].texts) == 6
