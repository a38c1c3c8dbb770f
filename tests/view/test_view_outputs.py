"""Views that never lie and never leave a broken file: a flagged row (kit.results.ok_mask) is shown as such and
never counted ok in any summary, table, panel, export or compare (issue 10 item 1); PNGs and exports are written
atomically, a file error is one line naming the path (issue 11 item 9); a file-name prefix keeps a second model's
plots apart (issue 11 item 8); the panel's compile checkbox is SweepConfig.compile (issue 14)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402

from kit._io import atomic_write_text  # noqa: E402
from kit.errors import OutputPathError, UserError  # noqa: E402
from kit.measure.engine import run_point  # noqa: E402
from kit.measure.sweep import SweepConfig  # noqa: E402
from kit.results import to_frame  # noqa: E402
from kit.view import plots  # noqa: E402
from kit.view.analysis import concurrency_knee, export_for_ci, scaling_exponents  # noqa: E402
from kit.view.compare_view import compare_frame, compare_summary  # noqa: E402
from kit.view.files import check_prefix, prefix_for, save_figure  # noqa: E402
from kit.view.panel import ControlPanel  # noqa: E402
from kit.view.render import point_problems, results_table, table_html  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def _frame(model="tiny-llama", flagged=((128, 4),), backend="engine"):
    """A 2 x 3 grid; the points in ``flagged`` have status ok but non-finite logits (a fast, wrong speed)."""
    rows = []
    for kv in (128, 512):
        for b in (1, 4, 16):
            bad = (kv, b) in flagged
            rows.append(
                {
                    "backend": backend,
                    "status": "ok",
                    "model": model,
                    "dtype": "float16",
                    "context_len": kv,
                    "concurrency": b,
                    "tpot_ms_p50": 2 + kv / 256 + b / 8,
                    "tpot_ms_p90": 3 + kv / 256 + b / 8,
                    "tok_s_per_stream": 1000 / (2 + kv / 256 + b / 8),
                    "decode_tok_s": 1e6 if bad else b * 1000 / (2 + kv / 256 + b / 8),
                    "output_tok_s": 1e6 if bad else b * 1000 / (2 + kv / 256 + b / 8),
                    "x_logits_finite": not bad,
                    "error": "non-finite logits in the last decode step" if bad else None,
                }
            )
    return to_frame(rows)


# ------------------------------------------------------------------ issue 10 item 1: flagged is never ok
def test_analysis_leaves_flagged_rows_out_of_scaling_and_knee():
    """The flagged kv=128 B=4 point claims 1e6 tok/s; counted as ok it makes a fake steep step and knee."""
    df = _frame()
    steps = scaling_exponents(df)
    kv128 = steps[steps["context_len"] == 128]
    assert list(zip(kv128["from"], kv128["to"])) == [(1, 16)] and kv128["y_to"].max() < 1e5
    knee = concurrency_knee(df)
    assert knee.set_index("context_len").loc[128, "max_y"] < 1e5
    all_bad = _frame(flagged=[(kv, b) for kv in (128, 512) for b in (1, 4, 16)])
    assert scaling_exponents(all_bad).empty and concurrency_knee(all_bad).empty


def test_served_plot_draws_no_flagged_speed_and_says_so(tmp_path):
    df = _frame(backend="openai", flagged=((128, 4), (512, 16)))
    fig = plots.plot_served(df, title="served")
    ys = [y for line in fig.axes[0].get_lines() for y in line.get_ydata()]
    assert ys and max(ys) < 1e5  # the 1e6 tok/s of the flagged points is not drawn
    assert "not drawn: 2 flagged" in fig._suptitle.get_text()
    save_figure(fig, tmp_path / "served.png")
    assert (tmp_path / "served.png").read_bytes().startswith(PNG)


def test_table_problems_export_and_compare_show_flagged_rows(tmp_path):
    df = _frame()
    table = results_table(df)
    assert list(table["status"]).count("flagged") == 1 and list(table["status"]).count("ok") == 5
    assert "flagged" in table_html(df)
    problems = point_problems(df)
    assert len(problems) == 1 and "kv=128 B=4" in problems[0] and "non-finite" in problems[0]
    s = json.loads(export_for_ci(df, tmp_path / "ci")["summary_json"].read_text())
    assert (s["n_ok"], s["n_flagged"]) == (5, 1)
    both = compare_frame({"a": df, "b": _frame(flagged=())})
    summary = compare_summary(both)
    a128_4 = summary[(summary["label"] == "a") & (summary["context_len"] == 128) & (summary["concurrency"] == 4)]
    assert a128_4.empty or not (a128_4.select_dtypes("number") > 1e5).any().any()


def test_no_file_a_view_writes_says_ok_for_a_flagged_row(tmp_path):
    """Issue 22 item 7: summary.json listed the overflowing float16 point with status "ok" beside verdict
    "flagged". One vocabulary in every export: the flagged kv=128 B=4 row reads "flagged" in each file written."""
    import pandas as pd

    def status_of(frame):
        row = frame[(frame["context_len"] == 128) & (frame["concurrency"] == 4)]
        return list(row["status"])

    df = _frame()
    paths = export_for_ci(df, tmp_path / "ci")
    s = json.loads(paths["summary_json"].read_text())
    bad = [p for p in s["points"] if (p["context_len"], p["concurrency"]) == (128, 4)]
    assert [(p["status"], p["verdict"]) for p in bad] == [("flagged", "flagged")]
    assert s["statuses"] == {"ok": 5, "flagged": 1} and (s["n_ok"], s["n_flagged"]) == (5, 1)
    assert status_of(pd.read_csv(paths["csv"])) == ["flagged"]
    assert status_of(pd.read_parquet(paths["parquet"])) == ["flagged"]
    assert "| flagged |" in paths["summary_md"].read_text()
    for p in s["points"]:  # ok in a file means ok by kit.results.ok_mask
        assert (p["status"] == "ok") == (p["verdict"] == "ok")
    problems = point_problems(df)
    assert len(problems) == 1 and problems[0].startswith("flagged: float16 kv=128 B=4")
    panel = ControlPanel(out_dir=tmp_path / "panel", threaded=False)
    panel.frame = df
    for fmt, read in (("csv", pd.read_csv), ("parquet", pd.read_parquet)):
        panel.export_format.value = fmt
        assert status_of(read(panel.on_export())) == ["flagged"]
    rec = df[(df["context_len"] == 128) & (df["concurrency"] == 4)].iloc[0].to_dict()
    panel.on_point(rec, df)
    assert panel.status.value.endswith("→ flagged")


def test_panel_counts_a_flagged_point_as_flagged_not_ok(tmp_path):
    p = ControlPanel(out_dir=tmp_path / "panel", threaded=False, kv_lens=[16, 32], concurrencies=[1, 2])
    p.decode_steps.value, p.warmup_steps.value, p.repeats.value, p.device.value = 2, 1, 1, "cpu"

    def runner(model, point, device, seed):
        rec = run_point(model, point, device, seed)
        if point.context_len == 32 and point.concurrency == 2:
            rec["x_logits_finite"] = False  # what a float16 overflow records
        return rec

    p.runner = runner
    p.on_run()
    assert p.state == "done"
    assert "(3 ok, 1 flagged)" in p.status.value
    assert p.table.value.count(">flagged<") == 1 and "non-finite" in p.message.value


# ------------------------------------------------------------------ issue 11 items 8 and 9: files
def test_standard_plots_take_a_prefix_so_two_models_share_an_out_dir(tmp_path):
    a = plots.save_standard_plots(_frame("tiny-llama"), tmp_path, prefix="tiny-llama_")
    b = plots.save_standard_plots(_frame("tiny-qwen"), tmp_path, prefix="tiny-qwen_")
    assert {p.name for p in a} == {
        "tiny-llama_throughput_vs_concurrency.png",
        "tiny-llama_tpot_vs_context.png",
        "tiny-llama_heatmap_decode_tok_s.png",
    }
    assert not set(a) & set(b) and all(p.read_bytes().startswith(PNG) for p in a + b)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in a + b)  # no .tmp left
    assert [p.name for p in plots.save_standard_plots(_frame(), tmp_path / "plain")][0] == (
        "throughput_vs_concurrency.png"
    )
    for name, want in (("tiny-llama", "tiny-llama_"), ("/ckpt/Llama 3.1/", "Llama-3.1_"), ("", "")):
        assert prefix_for(name) == want and check_prefix(prefix_for(name)) == want
    for bad in ("../x", "a/b", "has space", 3):
        with pytest.raises(UserError, match="prefix"):
            plots.save_standard_plots(_frame(), tmp_path, prefix=bad)


def test_a_failed_figure_write_leaves_no_partial_file_and_keeps_the_old_png(tmp_path):
    target = tmp_path / "plot.png"
    save_figure(plots.throughput_vs_concurrency(_frame()), target)
    before = target.read_bytes()

    def disk_fills(path, **kw):
        Path(path).write_bytes(PNG + b"half")  # a truncated PNG, then the disk fills
        raise OSError(28, "No space left on device")

    fig = plots.throughput_vs_concurrency(_frame())
    fig.savefig = disk_fills
    with pytest.raises(OutputPathError, match=r"cannot write .*plot\.png: No space left on device"):
        save_figure(fig, target)
    assert target.read_bytes() == before and sorted(tmp_path.iterdir()) == [target]


def test_file_errors_are_one_line_naming_the_path(tmp_path):
    long = tmp_path / ("x" * 300 + ".png")
    with pytest.raises(OutputPathError) as ei:
        save_figure(plots.throughput_vs_concurrency(_frame()), long)
    assert str(long) in str(ei.value) and "\n" not in str(ei.value)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="is a file"):
        export_for_ci(_frame(), tmp_path / "file" / "ci")
    with pytest.raises(OutputPathError, match="file"):
        plots.save_standard_plots(_frame(), tmp_path / "file")


def test_read_only_directory(tmp_path, monkeypatch):
    """A read-only directory (simulated where the tests run as root, whom chmod does not stop): one line each."""
    import tempfile

    ro = tmp_path / "ro"
    ro.mkdir()

    def read_only(*a, dir=None, **kw):
        if dir is not None and Path(dir) == ro:
            raise OSError(30, "Read-only file system", str(dir))
        return real(*a, dir=dir, **kw)

    real = tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    for write in (
        lambda: atomic_write_text(ro / "summary.md", "x"),
        lambda: plots.save_standard_plots(_frame(), ro),
        lambda: export_for_ci(_frame(), ro),
    ):
        with pytest.raises(OutputPathError, match=f"cannot write {ro}/.*: Read-only file system"):
            write()
    assert list(ro.iterdir()) == []


# ------------------------------------------------------------------ issue 14: the compile checkbox
def test_panel_compile_checkbox_is_sweep_config_compile(tmp_path):
    p = ControlPanel(out_dir=tmp_path / "p", threaded=False)
    assert p.compile.value is SweepConfig().compile and p.config().compile is SweepConfig().compile
    q = ControlPanel(out_dir=tmp_path / "q", threaded=False, compile=True)
    assert q.compile.value is True and q.config().compile is True
    q.compile.value = False
    assert q.config().compile is False
    assert "kit-compile" in p.compile._dom_classes
