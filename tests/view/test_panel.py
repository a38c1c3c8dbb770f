"""The control panel and compare view, driven without a browser: set ``.value``, call the handlers, assert on state.

(``Button.click()`` swallows handler exceptions, so these tests call the handlers themselves.)
"""
from __future__ import annotations

import json
import threading
import time

import pandas as pd
import pytest
import torch

from kit import metrics
from kit.measure.engine import run_point
from kit.results import load_results
from kit.view.panel import (CompareView, ControlPanel, compare_frame, parse_int_list, plot_png, point_problems,
                    results_table)

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
    df = pd.DataFrame([{"status": "ok", "dtype": "float16", "context_len": 16, "concurrency": 1,
                        "error": "non-finite logits in the last decode step"},
                       {"status": "ok", "dtype": "float32", "context_len": 16, "concurrency": 1, "error": None}])
    probs = point_problems(df)
    assert len(probs) == 1 and "float16" in probs[0] and "non-finite" in probs[0]
    assert results_table(pd.DataFrame()).empty and plot_png(pd.DataFrame()) is None
    with pytest.raises(ValueError, match="allowed"):
        plot_png(df, "pie chart")


def _fake_set(accel: str, tok_s: float) -> pd.DataFrame:
    rows = [{"status": "ok", "model": "m", "dtype": "bfloat16", "accelerator": accel, "n_gpus": 1,
             "context_len": c, "concurrency": b, "decode_tok_s": tok_s * b, "tpot_ms_p50": 1000 / tok_s}
            for c in (128, 512) for b in (1, 4)]
    return pd.DataFrame(rows)


def test_compare_frame_prices_from_catalog_and_user(tmp_path):
    from kit.catalog import load_catalog

    a, b = _fake_set("MI355X", 100.0), _fake_set("B300", 150.0)
    df = compare_frame({"mi355x": a, "b300": b}, prices={"b300": 6.0})
    assert set(df["label"]) == {"mi355x", "b300"} and len(df) == 8
    cat_price = load_catalog().price("MI355X", "tco").usd_per_gpu_hr
    r = df[(df.label == "mi355x") & (df.concurrency == 4) & (df.context_len == 128)].iloc[0]
    assert r.usd_per_gpu_hr == cat_price and r.price_basis == "tco"
    assert r.usd_per_mtok == pytest.approx(metrics.usd_per_mtok(400.0, cat_price))
    r = df[(df.label == "b300") & (df.concurrency == 1)].iloc[0]
    assert r.price_basis == "user" and r.usd_per_mtok == pytest.approx(6.0 / (150 * 3600) * 1e6)
    # no price for a CPU run on the catalog → NaN cost, no error
    cpu = compare_frame({"cpu": _fake_set("CPU", 10.0), "b300": b})
    assert cpu[cpu.label == "cpu"]["usd_per_mtok"].isna().all()
    with pytest.raises(ValueError, match="must be > 0"):
        compare_frame({"x": a}, prices={"x": 0})


def test_compare_view_handlers(tmp_path):
    from kit.results import save_results

    pa = save_results(_fake_set("MI355X", 100.0), tmp_path / "a")
    pb = save_results(_fake_set("B300", 150.0), tmp_path / "b")
    v = CompareView()
    v.on_compare()
    assert "at least two" in v.last_error and "at least two" in v.message.value
    (p1, l1, _), (p2, l2, price2) = v.rows
    p1.value, l1.value = str(pa), "MI355X run"
    p2.value, l2.value = str(tmp_path / "missing"), "B300 run"
    v.on_compare()
    assert "missing" in v.message.value
    p2.value, price2.value = str(pb), 6.0
    v.on_compare()
    assert v.last_error is None and len(v.frame) == 8
    assert v.plot.value.tobytes().startswith(PNG) and v.table.value.count("<tr") == 9
    v.y.value = "usd_per_mtok"
    assert v.plot.value.tobytes().startswith(PNG)
    l2.value = "MI355X run"
    v.on_compare()
    assert "used twice" in v.last_error


def test_compare_frame_unpriced_rows_do_not_blank_or_break_their_set():
    """A set mixing a priced (MI355X) and an unpriced (CPU) accelerator keeps the MI355X price; a served set with no
    accelerator column is compared on speed with NaN cost instead of failing the whole comparison."""
    mixed = pd.concat([_fake_set("MI355X", 100.0), _fake_set("CPU", 10.0)], ignore_index=True)
    served = _fake_set("B300", 150.0).drop(columns=["accelerator"])
    df = compare_frame({"mixed": mixed, "served": served})
    m = df[df.label == "mixed"]
    assert m[m.accelerator == "MI355X"]["usd_per_mtok"].notna().all()
    assert m[m.accelerator == "CPU"]["usd_per_mtok"].isna().all()
    s = df[df.label == "served"]
    assert len(s) == 4 and s["usd_per_mtok"].isna().all() and s["decode_tok_s"].notna().all()
