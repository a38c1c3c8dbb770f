"""The planner's latency-aware communication model, speculative decoding, and predict_like of a TP sweep."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest

from kit.errors import UserError
from kit.plan.comm import Link, collective_ms
from kit.plan.config import PredictConfig
from kit.plan.decode import STEP_TERMS
from kit.plan.roofline import predict_like, predict_point

TERMS = [f"x_t_{t}_ms" if t != "compute" else "x_t_compute_part_ms" for t in STEP_TERMS]


def _k3(acc, n, B=1, **kw):
    kw.setdefault("stack", "none")  # the catalog's links and overhead, without a serving-stack profile
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return predict_point("kimi-k3", B, 1424, PredictConfig(acc, n, prefill=False, **kw))


def test_collective_time_is_alpha_plus_bytes_over_busbw():
    link = Link("scale-up", 10.0, 100.0)
    assert collective_ms("all_reduce", 1e6, 8, link) == pytest.approx(0.010 + 1e6 * 2 * 7 / 8 / 100e9 * 1e3)
    assert collective_ms("all_reduce", 1e6, 1, link) == 0.0


def test_decode_step_is_the_sum_of_its_named_terms_and_counts_every_collective():
    r = _k3("B300", 8)
    assert r["tpot_ms_p50"] == pytest.approx(sum(r[c] for c in TERMS))
    # 93 attention all-reduces + 1 dense MLP all-reduce; dispatch + combine in 92 MoE layers; α = 7 µs (catalog)
    assert r["x_t_tp_allreduce_lat_ms"] == pytest.approx(94 * 7e-3)
    assert r["x_t_ep_alltoall_lat_ms"] == pytest.approx(184 * 7e-3)
    assert "tp_allreduce 94 × all_reduce 14.3 kB over 8 ranks on scale-up" in r["assumptions"]
    assert r["x_dominant_term"] == "weights" and r["x_link_source"].startswith("scale-up alpha")


def test_groups_across_nodes_pay_the_scale_out_link():
    one = _k3("B200", 16)  # default: TP8 within a node, PP2 across the two nodes
    assert (one["tp"], one["x_pp"]) == (8, 2) and one["x_t_pp_handoff_lat_ms"] == pytest.approx(46e-3)
    wide = _k3("B200", 16, tp=16)  # TP16/EP16 spans both nodes: every collective crosses the network
    assert wide["x_t_tp_allreduce_lat_ms"] == pytest.approx(94 * 46e-3)
    assert wide["x_dominant_term"] == "comm_lat" and wide["tok_s_per_stream"] < one["tok_s_per_stream"] / 2


def test_an_nvl72_rack_is_one_scale_up_domain_not_a_four_gpu_node():
    # GB200/GB300 compute trays hold 4 GPUs but NVLink joins 72: 8 GPUs are TP8 on NVLink (not TP4 x PP2 with a
    # scale-out hand-off, which made 8 GB200 plan slower per GPU than 8 H200 in the cost lesson)
    gb = _k3("GB300", 8)
    assert (gb["tp"], gb["x_pp"]) == (8, 1) and "over 8 ranks on scale-up" in gb["assumptions"]
    b = _k3("B300", 8)
    assert gb["tok_s_per_stream"] > 0.95 * b["tok_s_per_stream"]  # 8.0 vs 7.75 TB/s: no longer ~0.6x
    two = _k3("GB200", 16)  # TP8 x PP2 inside the rack: the hand-off stays on NVLink
    assert (two["tp"], two["x_pp"]) == (8, 2) and two["x_t_pp_handoff_lat_ms"] == pytest.approx(7e-3)
    forced = _k3("GB200", 8, tp=4)  # a user's TP4 x PP2 also stays on NVLink
    assert forced["x_t_pp_handoff_lat_ms"] == pytest.approx(7e-3)


def test_a_kit_comm_measurement_replaces_the_catalog_links():
    cal = {"links": {"scale-up": {"alpha_us": 20.0, "busbw_gb_s": 100.0}}, "path": "links.json"}
    r = _k3("B300", 8, comm_calibration=cal)
    assert r["x_t_tp_allreduce_lat_ms"] == pytest.approx(94 * 20e-3) and "kit comm" in r["x_link_source"]
    with pytest.raises(UserError, match="alpha_us=-1"):
        _k3("B300", 8, comm_calibration={"links": {"scale-up": {"alpha_us": -1, "busbw_gb_s": 1}}})


def test_speculative_decoding_emits_the_acceptance_length_per_verify_step():
    plain, spec = _k3("B300", 8, B=4), _k3("B300", 8, B=4, spec_k=1, spec_accept=1.85)
    assert spec["x_step_ms"] > plain["x_step_ms"] and spec["x_t_draft_ms"] > 0
    assert spec["tpot_ms_p50"] == pytest.approx(spec["x_step_ms"] / 1.85)
    assert spec["decode_tok_s"] == pytest.approx(4 * 1.85 * 1000 / spec["x_step_ms"])
    assert "speculative k=1" in spec["assumptions"]
    with pytest.raises(UserError, match="spec_accept=3"):
        _k3("B300", 8, spec_k=1, spec_accept=3)


def test_predict_like_of_a_tensor_parallel_sweep_keeps_its_tp():
    measured = pd.DataFrame(
        {"model": ["llama-3.1-70b"] * 2, "dtype": ["bfloat16"] * 2, "concurrency": [1, 1], "context_len": [512, 512],
         "n_gpus": [1, 4], "tp": [1, 4], "status": ["ok", "ok"]}
    )  # fmt: skip
    p = predict_like(measured, PredictConfig("H100"))
    assert sorted(p["tp"].tolist()) == [1, 4] and sorted(p["n_gpus"].tolist()) == [1, 4]
