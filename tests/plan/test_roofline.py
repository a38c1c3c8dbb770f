"""kit.plan.roofline: roofline rows in the results schema, predict_like / prediction_error, stored planner grids."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from kit.errors import UserError
from kit.plan.config import PredictConfig
from kit.plan.device import DEFAULT_GPU_OVERHEAD_MS_PER_LAYER
from kit.plan.roofline import predict_grid, predict_like, predict_point, prediction_error
from kit.plan.sizes import weight_bytes
from kit.plan.spec import get_spec
from kit.plan.step import expert_coverage
from kit.results import validate_record
from kit.view.plan_plots import overlay_figure


def test_expert_coverage():
    assert expert_coverage(256, 1, 8) == pytest.approx(1 - (255 / 256) ** 8)
    assert expert_coverage(256, 10_000, 8) == pytest.approx(1.0)
    assert expert_coverage(0, 5, 1) == 0.0


def test_decode_is_memory_bound_at_batch_one_and_matches_formula():
    r = predict_point("llama-3.1-8b", 1, 1024, PredictConfig("H100", prefill=False))
    assert r["x_bound"] == "memory" and r["status"] == "ok"
    s = get_spec("llama-3.1-8b")
    bytes_ = sum(weight_bytes(s).values()) - s.param_counts()["embed"] * 2 + 4096 * 2 + 1024 * 131_072
    assert r["x_bytes_per_step"] == pytest.approx(bytes_)
    ovh = 32 * DEFAULT_GPU_OVERHEAD_MS_PER_LAYER  # the documented per-layer GPU launch overhead
    assert r["tpot_ms_p50"] == pytest.approx(bytes_ / (3.35e12 * 0.7) * 1e3 + ovh, rel=1e-6)
    assert r["x_t_weights_ms"] + r["x_t_kv_ms"] == pytest.approx(bytes_ / (3.35e12 * 0.7) * 1e3)
    assert r["decode_tok_s"] == pytest.approx(1000 / r["tpot_ms_p50"])


def test_decode_time_monotone_in_batch_and_context():
    t = [
        predict_point("deepseek-v3", b, c, PredictConfig("H200", 8, prefill=False))["tpot_ms_p50"]
        for b, c in ((1, 1024), (8, 1024), (64, 1024), (64, 8192))
    ]
    assert t == sorted(t)


def test_planner_rows_fit_the_results_schema():
    df = predict_grid("tiny-llama", (1, 4), (128, 512), PredictConfig("H100"))
    assert len(df) == 4 and set(df["backend"]) == {"planner"}
    for rec in df.to_dict("records"):
        validate_record(rec)
    for col in ("eff_bw", "eff_flops", "tp", "assumptions", "tpot_ms_p50", "prefill_ms"):
        assert df[col].notna().all(), col


def test_oom_point_has_status_and_no_timings():
    r = predict_point("kimi-k3", 1, 1024, PredictConfig("B200", 8))
    assert r["status"] == "oom" and "fit" in r["error"] and r["tpot_ms_p50"] is None


def test_predict_like_and_compare():
    cal = {
        "device": "cpu",
        "memory_gb": 16.0,
        "mem_bw_gb_s": 10.0,
        "matmul_tflops": {"float32": 0.1},
        "overhead_ms_fixed": 1.0,
        "overhead_ms_per_layer": 0.5,
    }
    measured = pd.DataFrame(
        [
            {
                "backend": "engine",
                "status": "ok",
                "model": "tiny-llama",
                "dtype": "float32",
                "concurrency": b,
                "context_len": c,
                "decode_steps": 16,
                "tpot_ms_p50": 5.0,
            }
            for b in (1, 4)
            for c in (128, 512)
        ]
    )
    pred = predict_like(measured, PredictConfig("local", calibration=cal))
    assert len(pred) == 4 and (pred["x_attend_len"] == pred["context_len"] + 16).all()
    err = prediction_error(measured, pred)
    assert len(err) == 4
    assert err["error_pct"].tolist() == pytest.approx((100 * (err["predicted"] - 5.0) / 5.0).tolist())
    fig = overlay_figure(measured, pred)
    assert fig.axes[0].get_title().startswith("planner")


def test_predict_like_one_row_per_grid_point():
    cal = {"device": "cpu", "memory_gb": 16.0, "mem_bw_gb_s": 10.0, "matmul_tflops": {"float32": 0.1}}
    rows = [
        {
            "backend": "engine",
            "status": "ok",
            "model": "tiny-llama",
            "dtype": "float32",
            "concurrency": 1,
            "context_len": 128,
            "decode_steps": 16,
            "tpot_ms_p50": t,
        }
        for t in (5.0, 6.0)
    ]
    measured = pd.DataFrame(rows)
    pred = predict_like(measured, PredictConfig("local", calibration=cal))
    assert len(pred) == 1
    assert len(prediction_error(measured, pd.concat([pred, pred]))) == 2  # one per measured row, no cross product
    flagged = measured.assign(x_logits_finite=[True, False])  # the second row overflowed: not a measurement
    assert prediction_error(flagged, pred)["measured"].tolist() == [5.0]
    with pytest.raises(UserError, match="no ok rows"):  # flagged rows are not ok rows
        predict_like(measured.assign(x_logits_finite=False), PredictConfig("local", calibration=cal))


# ---------------------------------------------------------------- stored predictions (the one grid runner)
def test_predict_grid_stores_rows_like_a_sweep_and_resumes(tmp_path):
    from kit.store import load_results

    grid = ("tiny-llama", (1, 4), (128, 512))
    cfg = PredictConfig("H100", dtype="bfloat16")
    mem = predict_grid(*grid, cfg)
    df = predict_grid(*grid, cfg, out_dir=tmp_path)
    assert {"points.jsonl", "results.parquet", "results.json"} <= {p.name for p in tmp_path.iterdir()}
    assert len(df) == 4 and set(df["backend"]) == {"planner"} and df["point_id"].nunique() == 4
    assert len((tmp_path / "points.jsonl").read_text().splitlines()) == 4
    stored = load_results(tmp_path)
    assert sorted(stored["point_id"]) == sorted(mem["point_id"])  # same points with or without out_dir
    assert stored.sort_values("point_id")["tpot_ms_p50"].tolist() == pytest.approx(
        mem.sort_values("point_id")["tpot_ms_p50"].tolist()
    )
    again = predict_grid(*grid, cfg, out_dir=tmp_path)  # resume: nothing predicted again
    assert len(again) == 4 and len((tmp_path / "points.jsonl").read_text().splitlines()) == 4
    predict_grid(*grid, cfg, out_dir=tmp_path, resume=False)  # archived, predicted again
    assert len((tmp_path / "points.jsonl").read_text().splitlines()) == 4 and (tmp_path / "previous").is_dir()
    other = predict_grid(*grid, replace(cfg, eff_bw=0.5), out_dir=tmp_path)  # new settings: new points
    assert len(other) == 8 and set(other["backend"]) == {"planner"}


def test_predict_grid_oom_points_are_stored_as_oom(tmp_path):
    df = predict_grid("kimi-k3", (1,), (1024,), PredictConfig("B200", 8), out_dir=tmp_path)
    assert df["status"].tolist() == ["oom"] and "fit" in df["error"].iloc[0]
    again = predict_grid("kimi-k3", (1,), (1024,), PredictConfig("B200", 8), out_dir=tmp_path)
    assert len(again) == 1  # an oom point is finished: not predicted again


def test_planner_backend_validates_before_storing(tmp_path):
    from kit.errors import UnknownNameError, UserError
    from kit.plan.roofline import PlannerBackend

    with pytest.raises(UserError, match="exceeds"):
        predict_grid("llama-3.1-8b", (1,), (10_000_000,), PredictConfig("B300"), out_dir=tmp_path)
    with pytest.raises(UserError, match="fp7"):
        predict_grid("llama-3.1-8b", (1,), (128,), PredictConfig("B300", kv_dtype="fp7"), out_dir=tmp_path)
    with pytest.raises(UnknownNameError, match="Z100"):
        PlannerBackend("llama-3.1-8b", config=PredictConfig("Z100"))
    assert not (tmp_path / "points.jsonl").exists()
    b = PlannerBackend("llama-3.1-8b", (1, 8), (1024,), PredictConfig("H100"))
    pts = b.points()
    assert b.kind == "planner" and [p.columns["concurrency"] for p in pts] == [1, 8]
    assert b.measure(pts[1])["backend"] == "planner" and b.after_failure() == {}
