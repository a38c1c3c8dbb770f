"""The planner and cost notebooks, executed by papermill with small parameters; assertions on the files they wrote."""

from __future__ import annotations

import pandas as pd
import pytest
from nbexec import execute

pytestmark = pytest.mark.slow


def _run(rel: str):
    """Executed once per session by nbexec (parameters in nbexec.SMALL; the docs build renders the same copy)."""
    return execute(rel).out_dir


def test_will_this_model_fit():
    out = _run("how-to/will-this-model-fit.ipynb")
    fit = pd.read_csv(out / "fit.csv")
    assert set(fit.accelerator) == {"MI355X", "B300"} and set(fit.kv_dtype) == {"bfloat16", "fp8"}
    assert fit.fits_weights.all() and (fit.weights_gb_total > 1500).all()
    assert (fit.context_len == 1424).all() and (fit.max_concurrency >= 64).all()
    bf = fit[fit.kv_dtype == "bfloat16"].set_index("accelerator")
    assert bf.loc["MI355X", "max_concurrency"] > bf.loc["B300", "max_concurrency"]
    mins = pd.read_csv(out / "min_gpus.csv").set_index("accelerator")
    assert mins.loc["MI355X", "min_gpus"] == 8 and mins.loc["B200", "min_gpus"] == 16
    groups = pd.read_csv(out / "weights_by_group.csv", index_col=0)
    assert groups.loc["routed_experts", "dtype"] == "mxfp4"
    assert (out / "memory_per_gpu.png").stat().st_size > 0
    mem = pd.read_csv(out / "memory_per_gpu.csv")
    assert len(mem) == len(fit) and list(mem.columns[1:5]) == ["weights", "reserve", "kv_at_max_users", "unused"]
    assert (mem["weights"].round(6) == fit["weights_gb_per_gpu"].round(6)).all()
    assert mem["users"].str.endswith(" users").all()


def test_what_does_a_million_tokens_cost():
    out = _run("how-to/what-does-a-million-tokens-cost.ipynb")
    t = pd.read_csv(out / "published_cost.csv")
    peak = t[t.point == "peak"].set_index(["system", "price_basis"])["usd_per_mtok"].round(2)
    assert peak[("8x MI355X", "assumed-rental")] == 5.84
    assert peak[("8x B300", "assumed-rental")] == 8.50
    assert peak[("8x MI355X", "tco")] == 3.45
    eq = pd.read_csv(out / "equal_interactivity.csv")
    assert set(eq.price_basis) >= {"assumed-rental", "tco"} and eq.usd_per_mtok.notna().any()
    pc = pd.read_csv(out / "planner_cost.csv")
    assert set(pc.accelerator) == {"MI355X", "B300"} and set(pc.backend) == {"planner"}
    for png in ("published_cost_vs_interactivity.png", "planner_vs_published_cost.png"):
        assert (out / png).stat().st_size > 0


def test_kv_cache_memory_gqa_vs_mla():
    out = _run("explanation/kv-cache-memory-gqa-vs-mla.ipynb")
    kv = pd.read_csv(out / "kv_per_token.csv").set_index("model")
    assert kv.loc["llama-3.1-8b", "kv_B_per_token_bf16"] == 131072
    assert kv.loc["llama-3.1-8b", "GiB_per_seq_at_131072"] == 16.0
    assert kv.loc["deepseek-v3", "kv_B_per_token_bf16"] == 70272
    assert kv.loc["deepseek-v3", "kv_B_per_token_fp8"] == 35136
    tps = pd.read_csv(out / "tp_sharding.csv").set_index("model")
    assert tps.loc["deepseek-v3", "split_factor"] == 1 and tps.loc["llama-3.1-70b", "split_factor"] == 8
    m = pd.read_csv(out / "measured_vs_formula.csv")
    assert (m.measured_B_per_token == m.formula_B_per_token).all() and set(m.attention) == {"GQA", "MLA"}
    for png in ("kv_per_token.png", "kv_vs_context.png", "tp_sharding.png"):
        assert (out / png).stat().st_size > 0


def test_why_decode_is_memory_bound_planner_cells():
    """The planner cells always run (no skip on error): the overlay of the measured grid and the catalog table."""
    from kit.store import load_results

    out = _run("explanation/why-decode-is-memory-bound.ipynb")
    roof = pd.read_csv(out / "roofline.csv")
    assert len(roof) == 4 and set(roof.x_bound) <= {"memory", "compute", "overhead"}
    assert (roof.flops_per_byte > 0).all()
    big = pd.read_csv(out / "roofline_big.csv")
    assert list(big.concurrency) == [1, 4, 16, 64, 256]
    assert big.loc[big.concurrency == 1, "x_bound"].iloc[0] == "memory"
    stored = load_results(out / "roofline_big")  # stored like a measured sweep, by the one grid runner
    assert len(stored) == 5 and set(stored.backend) == {"planner"} and set(stored.status) == {"ok"}
    for png in ("planner_overlay.png", "roofline_big.png", "measured.png"):
        assert (out / png).stat().st_size > 0
