"""The interconnect notebooks (issue 12), executed by papermill with small parameters (nbexec.SMALL); assertions on
the files they wrote: the probe's rows per collective and size with busbw = algbw × the nccl-tests factor, its
plots and decode-path line, and the explanation's stacked decode-step terms beside the published figures."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from nbexec import execute

from kit.measure.comm import OPS
from kit.metrics import busbw_factor
from kit.store import load_results

pytestmark = pytest.mark.slow


def _png_ok(path, min_bytes: int = 10_000) -> bool:
    return path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > min_bytes


def test_probe_the_interconnect_rows_busbw_plots_and_decode_line():
    out = execute("how-to/probe-the-interconnect.ipynb").out_dir
    df = load_results(out)  # stored by kit.measure.comm.run_comm, not by the notebook
    assert df.run_id.nunique() == 1 and set(df.backend) == {"comm"} and set(df.status) == {"ok"}
    probe = df[df.x_decode_term.isna()]
    sizes = [8, 16, 32, 64, 128, 256]  # 8 B doubling to max_bytes=256 (nbexec.SMALL)
    assert sorted(zip(probe.x_op, probe.x_size_bytes)) == sorted((op, s) for op in OPS for s in sizes)
    assert set(probe.x_n_ranks) == {2} and set(probe.x_dist_backend) == {"gloo"} and set(probe.x_n) == {3}
    assert (probe.x_lat_us_p50 > 0).all() and (probe.x_lat_us_p99 >= probe.x_lat_us_p50).all()
    factor = np.array([busbw_factor(op, int(n)) for op, n in zip(probe.x_op, probe.x_n_ranks)])
    np.testing.assert_allclose(probe.x_busbw_gb_s, probe.x_algbw_gb_s * factor, rtol=1e-9)
    np.testing.assert_allclose(probe.x_algbw_gb_s, probe.x_size_bytes / (probe.x_lat_us_p50 * 1e-6) / 1e9, rtol=1e-6)
    # the notebook's table carries the same rows and the factor it printed
    table = pd.read_csv(out / "probe.csv")
    assert len(table) == len(probe) == 36
    by_op = table.groupby("op").factor.first().to_dict()
    assert by_op == {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5,
                     "broadcast": 1.0, "send_recv": 1.0}  # fmt: skip
    # the decode-step messages of kimi-k3 at B=1 over 2 ranks: TP all-reduce of 1 × 7168 × 2 B, EP all-to-all
    dec = df[df.x_decode_term.notna()].set_index("x_decode_term")
    assert dec.loc["tp_allreduce", "x_size_bytes"] == 14336 and dec.loc["tp_allreduce", "x_op"] == "all_reduce"
    assert dec.loc["tp_allreduce", "x_decode_count"] == 94 and dec.loc["ep_alltoall", "x_decode_count"] == 184
    lines = (out / "decode_path.txt").read_text().splitlines()
    assert lines[0].startswith("per decode step this model pays 94 × ") and "tp_allreduce (14,336 B" in lines[0]
    assert any(ln.startswith("per decode step this model pays") and "in collectives" in ln for ln in lines)
    assert lines[-1].startswith("planner (B300, TP2 EP2): collectives ") and "decode step" in lines[-1]
    for png in ("comm_latency.png", "comm_busbw.png"):
        assert _png_ok(out / png), png
    links = json.loads((out / "links.json").read_text())["links"]["scale-up"]
    assert links["n_ranks"] == 2 and links["alpha_size_bytes"] == 8 and links["busbw_gb_s"] > 0


def test_why_two_nodes_decode_slower_bars_layouts_and_summary():
    out = execute("explanation/why-two-nodes-decode-slower.ipynb").out_dir
    step = pd.read_csv(out / "decode_step.csv")
    assert list(zip(step.system, step.layout)) == [
        ("8x MI355X", "TP8 EP8 PP1"),
        ("8x B300", "TP8 EP8 PP1"),
        ("2x8 B200", "TP8 EP8 PP2"),
        ("2x8 B200", "TP16 EP16 PP1"),
    ]
    assert list(step.published_tok_s) == [118, 172, 90, 90]
    np.testing.assert_allclose(step.published_ms, 1000 / step.published_tok_s)
    terms = ["x_t_weights_ms", "x_t_kv_ms", "x_t_compute_part_ms", "x_t_comm_lat_ms", "x_t_comm_bw_ms",
             "x_t_overhead_ms", "x_t_draft_ms"]  # fmt: skip
    np.testing.assert_allclose(step[terms].sum(axis=1), step.step_ms, rtol=1e-9)
    np.testing.assert_allclose(step.predicted_tok_s, 1000 / step.step_ms, rtol=1e-9)
    # at one user the collectives are latency: within a node and, far more, across nodes
    assert (step.x_t_comm_lat_ms > 50 * step.x_t_comm_bw_ms).all()
    two = step[step.system == "2x8 B200"].set_index("layout")
    assert two.loc["TP16 EP16 PP1", "x_t_comm_lat_ms"] > 5 * two.loc["TP8 EP8 PP2", "x_t_comm_lat_ms"]
    assert two.loc["TP16 EP16 PP1", "dominant"] == "comm_lat"
    calls = pd.read_csv(out / "collectives.csv")
    wide = calls[calls.layout == "TP16 EP16 PP1"]
    assert set(wide.link) == {"scale-out"} and wide.calls_per_step.sum() == 94 + 184
    pp = calls[(calls.layout == "TP8 EP8 PP2") & (calls.link == "scale-out")]
    assert list(pp.term) == ["pp_handoff"] and list(pp.calls_per_step) == [1]
    share = pd.read_csv(out / "latency_share.csv")
    b1 = share[share.x_decode_term == "B=1"]
    assert len(b1) == 2 and (b1.x_size_bytes == 14336).all() and (b1.alpha_share > 0.99).all()
    assert (share[share.x_size_bytes == 1 << 30].alpha_share < 0.01).all()
    s = json.loads((out / "summary.json").read_text())
    assert s["published_order"] == ["8x B300", "8x MI355X", "2x8 B200"]
    assert sorted(s["predicted_order"]) == sorted(s["published_order"])
    assert len(s["tok_s_predicted_over_published"]) == 4
    for png in ("decode_step_bars.png", "latency_vs_size.png", "stack_terms.png"):
        assert _png_ok(out / png), png
    # stack profiles beside the published points with their conditions (issue #26)
    bars = pd.read_csv(out / "stack_terms.csv")
    assert list(bars.system) == ["8x B300"] * 2 + ["8x MI355X"] * 2 + ["2x8 B200"] * 2
    cols = [c for c in bars.columns if c.startswith("x_t_") and c != "x_t_compute_ms"]
    np.testing.assert_allclose(bars[cols].sum(axis=1) / bars.x_spec_accept, bars.predicted_ms, rtol=1e-9)
    floors = bars[[c for c in cols if c.startswith("x_t_floor_")]].sum(axis=1)
    assert (floors > 0).all() and bars["stack"].str.contains("sglang").all()
    like = bars[bars.label.str.contains("no spec")].set_index("system")
    assert list(like.published_ms.round(2).fillna(-1)) == [8.51, 20.86, -1]  # none published for two nodes
    assert "pipeline parallelism" in bars.set_index("label").loc["2x8 B200\nsingle stream, DSpark", "spec_note"]
