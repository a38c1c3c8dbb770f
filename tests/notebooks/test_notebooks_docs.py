"""Doc tests: every tutorial and how-to of the panel/analysis set runs under papermill with small parameters, and
its files are checked (row counts, columns, statuses, curve shapes; never timing values). Plus cases N1 and N2
(missing kernel, widgets headless, a dying kernel) and the rules every committed notebook follows.
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import papermill as pm
import pytest
from nbexec import execute

from kit.view.notebooks import NOTEBOOK_DIR, declared_parameters, list_notebooks, run_notebook

pytestmark = pytest.mark.slow
FIX = Path(__file__).parents[1] / "fixtures"


def results(path: Path) -> pd.DataFrame:
    from kit.store import load_results

    return load_results(path)


def png(path: Path) -> bool:
    return path.exists() and path.read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------------------- tutorials
def test_tutorial_02_explore_with_the_panel():
    ex = execute("tutorials/02-explore-with-the-panel.ipynb")
    out = ex.out_dir
    s = json.loads((out / "summary.json").read_text())
    assert s["first_points"] == 4
    assert 1 <= s["second_points"] <= 4 and s["second_state"] in ("stopped", "done")
    runs = sorted((out / "panel").glob("run-*"))
    assert len(runs) == 2 and all((r / "points.jsonl").exists() for r in runs)
    first = results(runs[0])
    assert sorted(zip(first.context_len, first.concurrency)) == [(16, 1), (16, 2), (64, 1), (64, 2)]
    assert set(first.status) == {"ok"} and set(first.dtype) == {"float32"}
    assert set(results(runs[1]).dtype) == {"bfloat16"}
    cmp = pd.read_parquet(out / "compare.parquet")
    assert set(cmp.label) == {"float32", "bfloat16 (stopped)"}
    ok = cmp[cmp.status == "ok"]
    assert (ok.usd_per_mtok > 0).all() and set(ok.price_basis) == {"user"}
    # the panel rendered as a widget view in the executed notebook
    mimes = {k for c in ex.nb.cells if c.cell_type == "code" for o in c.outputs for k in o.get("data", {})}
    assert "application/vnd.jupyter.widget-view+json" in mimes


# ------------------------------------------------------------------------------------------- how-to
def test_howto_sweep_kv_cache_length():
    out = execute("how-to/sweep-kv-cache-length.ipynb").out_dir
    df = results(out).sort_values("context_len")
    assert list(df.context_len) == [16, 64, 256] and set(df.status) == {"ok"} and set(df.concurrency) == {1}
    assert (df.tpot_n == 4).all()
    assert np.all(np.diff(df.kv_cache_gb.astype(float)) > 0)  # the cache grows with context
    t = pd.read_csv(out / "kv_sweep.csv")
    assert len(t) == 3 and {"tpot_ms_p50", "tpot_ms_p90", "kv_cache_gb"} <= set(t.columns)
    assert png(out / "tpot_vs_context.png")


def test_howto_find_the_concurrency_knee():
    out = execute("how-to/find-the-concurrency-knee.ipynb").out_dir
    assert len(results(out)) == 3
    steps = pd.read_csv(out / "scaling_steps.csv")
    assert list(zip(steps["from"], steps["to"])) == [(1, 2), (2, 4)] and steps.exponent.notna().all()
    knee = pd.read_csv(out / "knee.csv")
    assert list(knee.context_len) == [16]
    k = knee.knee.iloc[0]
    assert (pd.isna(k) and not knee.reached.iloc[0]) or (k in (1, 2, 4) and knee.reached.iloc[0])
    assert png(out / "knee.png")


def test_howto_compare_dtypes():
    out = execute("how-to/compare-dtypes.ipynb").out_dir
    df = results(out)
    assert sorted(df.dtype.unique()) == ["bfloat16", "float16", "float32"] and len(df) == 6
    assert "x_logits_finite" in df.columns
    cmp = pd.read_csv(out / "dtype_comparison.csv", keep_default_na=False, na_values=[""])
    assert len(cmp) == 6 and {"speedup_vs_float32", "flag", "logits_finite"} <= set(cmp.columns)
    base = cmp[cmp.dtype == "float32"]
    assert np.allclose(base.speedup_vs_float32.astype(float), 1.0)
    # a point with non-finite logits never reports a speed
    fin = cmp.logits_finite.astype(str) == "True"
    assert cmp.loc[~fin, "decode_tok_s"].isna().all()
    assert png(out / "dtypes.png")


def test_howto_compare_two_result_sets():
    out = execute("how-to/compare-two-result-sets.ipynb").out_dir
    cmp = pd.read_parquet(out / "compare.parquet")
    assert len(cmp) == 8 and set(cmp.label) == {"float32", "bfloat16"}
    ok = cmp[cmp.status == "ok"]
    assert len(ok) == 8 and np.isfinite(ok.usd_per_mtok).all() and (ok.usd_per_mtok > 0).all()
    summary = pd.read_csv(out / "compare_summary.csv")
    assert len(summary) == 8 and {"decode_tok_s", "usd_per_mtok"} <= set(summary.columns)
    assert png(out / "compare_decode_tok_s.png") and png(out / "compare_usd_per_mtok.png")


def test_howto_run_the_seed_workload():
    out = execute("how-to/run-the-seed-workload.ipynb").out_dir
    df = results(out)
    assert sorted(df.concurrency) == [24, 64] and set(df.status) == {"ok"}
    assert set(df.context_len) == {16} and set(df.decode_steps) == {6}  # 1024 and 400 scaled by 1/64
    assert df.ttft_ms.notna().all()  # a real prefill was timed
    t = pd.read_csv(out / "seed_workload.csv")
    assert len(t) == 2 and {"ttft_ms", "tpot_ms_p50", "decode_tok_s", "tok_s_per_stream"} <= set(t.columns)


def test_howto_load_a_local_checkpoint():
    out = execute("how-to/load-a-local-checkpoint.ipynb").out_dir
    ck = out / "checkpoint"
    assert (ck / "config.json").exists() and list(ck.glob("*.safetensors"))
    df = results(out / "sweep")
    assert len(df) == 4 and set(df.status) == {"ok"} and set(df.model) == {str(ck)}


def test_howto_export_results_for_ci():
    out = execute("how-to/export-results-for-ci.ipynb").out_dir
    ci = out / "ci"
    s = json.loads((ci / "summary.json").read_text())
    assert s["n_points"] == 4 and s["n_ok"] == 4 and len(s["points"]) == 4
    assert {"tpot_ms_p50", "tpot_n", "status"} <= set(s["points"][0])
    assert len(pd.read_csv(ci / "results.csv")) == 4 and len(results(ci / "results.parquet")) == 4
    assert (ci / "summary.md").read_text().startswith("4/4 points ok")


# ------------------------------------------------------------------------------------------- reference + explanation
@pytest.mark.parametrize(
    "rel, files",
    [
        ("reference/accelerator-catalog.ipynb", ["accelerators.csv", "prices.csv"]),
        ("reference/model-presets.ipynb", ["presets.csv"]),
        ("reference/metric-definitions.ipynb", ["metric_functions.csv"]),
        ("reference/results-schema.ipynb", ["schema.csv"]),
        ("reference/front-door.ipynb", ["front_door.csv"]),
    ],
)
def test_reference_rendered_from_kit_data(rel, files):
    out = execute(rel).out_dir
    for f in files:
        assert len(pd.read_csv(out / f)) > 0, f
    if rel.endswith("results-schema.ipynb"):
        from kit.results import COLUMN_NAMES

        assert tuple(pd.read_csv(out / "schema.csv").column) == COLUMN_NAMES
    if rel.endswith("front-door.ipynb"):  # every name of the front door, at its home, with a summary
        import kit

        table = pd.read_csv(out / "front_door.csv")
        assert list(table["name"]) == [f"kit.{n}" for n in kit.FRONT_DOOR] and table["summary"].notna().all()
        assert list(table["home"]) == [h.replace(":", ".") for h in kit.FRONT_DOOR.values()]


def test_explanation_why_decode_is_memory_bound():
    out = execute("explanation/why-decode-is-memory-bound.ipynb").out_dir
    assert len(results(out)) == 4
    g = pd.read_csv(out / "growth.csv")
    assert list(g.context_len) == [16, 128] and (g["B grew x"] == 4).all()
    assert png(out / "measured.png")
    big = pd.read_csv(out / "roofline_big.csv")  # the planner's part is required: memory-bound at B=1
    assert big.loc[big.concurrency == 1, "x_bound"].iloc[0] == "memory"


def test_explanation_performance_per_dollar():
    out = execute("explanation/performance-per-dollar.ipynb").out_dir
    g = pd.read_csv(out / "cost_grid.csv")
    assert set(g.accelerator) == {"MI355X", "B300", "H200"} and len(g) == 9
    for _, a in g.groupby("accelerator"):  # bigger batch → cheaper tokens, slower per user
        a = a.sort_values("concurrency")
        assert np.all(np.diff(a.usd_per_mtok) < 0) and np.all(np.diff(a.tok_s_per_stream) <= 0)
    assert png(out / "cost_vs_interactivity.png")


# ------------------------------------------------------------------------------------------- notebook rules
ALL_NOTEBOOKS = list_notebooks()


@pytest.mark.parametrize("rel", ALL_NOTEBOOKS)
def test_notebook_committed_clean(rel):
    """No outputs, kernelspec python3, a typed + commented parameters cell declaring out_dir."""
    path = NOTEBOOK_DIR / rel
    nb = nbformat.read(str(path), as_version=4)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", "kernelspec.name must be python3"
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"cells {dirty} have outputs or execution counts: strip them (kit.view.notebooks.strip_outputs)"
    params = declared_parameters(path)
    assert "out_dir" in params
    # papermill skips (with only a warning) any line holding a second "=", even inside the comment: such a
    # parameter cannot be set from outside. Every assigned name must be declared.
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assigned = {
        t.id
        for node in ast.parse(cell.source).body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    }
    assert not assigned - set(params), (
        f"assigned but not seen by papermill (a second '=' on the line?): {sorted(assigned - set(params))}"
    )
    untyped = [n for n, p in params.items() if p["inferred_type_name"] == "None"]
    uncommented = [n for n, p in params.items() if not p["help"].strip()]
    assert not untyped and not uncommented, f"untyped: {untyped}; no comment: {uncommented}"


def test_every_notebook_is_executed_by_the_doc_tests():
    """Each notebook has small parameters in nbexec.SMALL, so the suite executes it (once) and the docs show it."""
    from nbexec import SMALL

    assert sorted(SMALL) == ALL_NOTEBOOKS, f"missing from nbexec.SMALL: {sorted(set(ALL_NOTEBOOKS) - set(SMALL))}"


def _code_cells(rel: str) -> list[str]:
    nb = nbformat.read(str(NOTEBOOK_DIR / rel), as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


#: drawing calls a notebook may make itself: show the kit's figure, save it
ALLOWED_FIGURE_CALLS = {"show", "savefig", "close"}


@pytest.mark.parametrize("rel", ALL_NOTEBOOKS)
def test_notebook_draws_no_figure_by_hand(rel):
    """Every figure is a function in kit.view.plots returning a Figure; a notebook shows or saves it, and never
    draws on matplotlib itself (plt.subplots, ax.plot, fig.axes[0]...)."""
    for src in _code_cells(rel):
        tree = ast.parse(src)
        plt_names = {
            a.asname or a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.Import)
            for a in n.names
            if a.name == "matplotlib.pyplot"
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                base, attr = node.value.id, node.attr
                if base in plt_names | {"ax", "axes", "fig"} and attr not in ALLOWED_FIGURE_CALLS:
                    pytest.fail(f"{rel}: {base}.{attr} draws by hand; add a figure to kit/view/plots.py:\n{src}")


# ------------------------------------------------------------------------------------------- cases N1, N2
def test_n1_missing_kernel_needs_explicit_kernel_name(tmp_path):
    from jupyter_client.kernelspec import NoSuchKernel

    nb = FIX / "n1_missing_kernel.ipynb"
    with pytest.raises(NoSuchKernel):
        pm.execute_notebook(str(nb), str(tmp_path / "a.ipynb"), progress_bar=False)
    done = run_notebook(nb, tmp_path / "b.ipynb", cell_timeout_s=60)  # the kit passes kernel_name="python3"
    assert any("2" in o.get("text", "") for c in done.cells if c.cell_type == "code" for o in c.outputs)


def test_n2_widget_headless_has_view_and_text_fallback(tmp_path):
    done = run_notebook(FIX / "n2_widget.ipynb", tmp_path / "w.ipynb", cell_timeout_s=60)
    outs = [o for c in done.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "display_data"]
    assert len(outs) == 1
    data = outs[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in data and "IntSlider" in data["text/plain"]
    assert data["application/vnd.jupyter.widget-view+json"]["model_id"]


def test_n2_dying_kernel_fails_fast(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(Exception) as ei:
        run_notebook(FIX / "n2_dying_kernel.ipynb", tmp_path / "d.ipynb", cell_timeout_s=60)
    elapsed = time.monotonic() - t0
    assert "DeadKernel" in type(ei.value).__name__ or "died" in str(ei.value).lower(), repr(ei.value)
    assert elapsed < 60, f"took {elapsed:.0f} s: a dead kernel must fail fast, not wait for the timeout"
