"""kit.view.analysis on hand-made frames (no measuring)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kit.store import load_results
from kit.view.analysis import concurrency_knee, dtype_comparison, export_for_ci, scaling_exponents


def _frame(curve: dict[int, float], ctx=128):
    return pd.DataFrame(
        [{"status": "ok", "context_len": ctx, "concurrency": b, "decode_tok_s": y} for b, y in curve.items()]
    )


def test_knee_where_scaling_flattens():
    # linear to 8, then +10 % per doubling
    df = pd.concat(
        [_frame({1: 100, 2: 200, 4: 400, 8: 800, 16: 880, 32: 900}), _frame({1: 100, 2: 200, 4: 400}, ctx=512)]
    )
    s = scaling_exponents(df)
    assert s[s.context_len == 128]["exponent"].round(3).tolist()[:3] == [1.0, 1.0, 1.0]
    k = concurrency_knee(df).set_index("context_len")
    assert k.loc[128, "knee"] == 8 and k.loc[128, "reached"] and k.loc[128, "y_at_knee"] == 800
    assert pd.isna(k.loc[512, "knee"]) and not k.loc[512, "reached"]  # still scaling: extend the grid
    assert concurrency_knee(df, min_exponent=0.05).loc[0, "knee"] == 16
    # one noisy dip mid-curve is not the knee: the last scaling step is
    noisy = _frame({1: 100, 2: 200, 4: 150, 8: 600, 16: 620})
    assert concurrency_knee(noisy).loc[0, "knee"] == 8
    assert concurrency_knee(_frame({1: 100, 2: 101, 4: 102})).loc[0, "knee"] == 1  # flat from the start
    with pytest.raises(ValueError, match="min_exponent"):
        concurrency_knee(df, min_exponent=0)
    # OOM points are ignored
    oom = pd.concat(
        [df, pd.DataFrame([{"status": "oom", "context_len": 128, "concurrency": 64, "decode_tok_s": None}])]
    )
    assert concurrency_knee(oom).set_index("context_len").loc[128, "knee"] == 8


def test_dtype_comparison_flags_non_finite():
    rows = []
    for dt, tok, fin, st in (
        ("float32", 100.0, True, "ok"),
        ("bfloat16", 150.0, True, "ok"),
        ("float16", 400.0, False, "ok"),
    ):
        rows.append(
            {
                "dtype": dt,
                "context_len": 64,
                "concurrency": 1,
                "status": st,
                "decode_tok_s": tok,
                "tpot_ms_p50": 1000 / tok,
                "x_logits_finite": fin,
            }
        )
    rows.append(
        {
            "dtype": "float16",
            "context_len": 64,
            "concurrency": 2,
            "status": "oom",
            "decode_tok_s": None,
            "tpot_ms_p50": None,
            "x_logits_finite": None,
        }
    )
    out = dtype_comparison(pd.DataFrame(rows)).set_index(["dtype", "concurrency"])
    assert out.loc[("bfloat16", 1), "speedup_vs_float32"] == pytest.approx(1.5)
    f16 = out.loc[("float16", 1)]
    assert pd.isna(f16["decode_tok_s"]) and pd.isna(f16["speedup_vs_float32"]) and "non-finite" in f16["flag"]
    assert "oom" in out.loc[("float16", 2), "flag"]


def test_export_for_ci(tmp_path):
    df = pd.DataFrame(
        [
            {
                "backend": "engine",
                "status": "ok",
                "dtype": "float32",
                "context_len": 16,
                "concurrency": 1,
                "tpot_ms_p50": 1.5,
                "tpot_n": 4,
                "decode_tok_s": 666.7,
                "x_step_ms": [1.0, 2.0],
            },
            {
                "backend": "engine",
                "status": "oom",
                "dtype": "float32",
                "context_len": 16,
                "concurrency": 64,
                "error": "OutOfMemoryError",
            },
        ]
    )
    paths = export_for_ci(df, tmp_path / "ci", metadata={"who": "test"})
    assert set(paths) == {"parquet", "csv", "summary_json", "summary_md"}
    s = json.loads(paths["summary_json"].read_text())
    assert s["n_points"] == 2 and s["n_ok"] == 1 and s["statuses"] == {"ok": 1, "oom": 1}
    assert "x_step_ms" not in pd.read_csv(paths["csv"]).columns
    assert load_results(paths["parquet"]).attrs["metadata"] == {"who": "test"}
    md = paths["summary_md"].read_text()
    assert md.startswith("1/2 points ok") and md.count("\n| float32") == 2


def test_export_for_ci_does_not_count_a_flagged_row_ok(tmp_path):
    df = pd.DataFrame(
        [
            {
                "backend": "engine",
                "status": "ok",
                "dtype": "float16",
                "context_len": 16,
                "concurrency": 1,
                "decode_tok_s": 900.0,
                "x_logits_finite": False,
            },
            {
                "backend": "engine",
                "status": "ok",
                "dtype": "float32",
                "context_len": 16,
                "concurrency": 1,
                "decode_tok_s": 100.0,
                "x_logits_finite": True,
            },
        ]
    )
    s = json.loads(export_for_ci(df, tmp_path / "ci")["summary_json"].read_text())
    assert s["n_ok"] == 1 and s["n_flagged"] == 1 and [p["verdict"] for p in s["points"]] == ["flagged", "ok"]
    assert (tmp_path / "ci" / "summary.md").read_text().startswith("1/2 points ok")
    assert "| flagged |" in (tmp_path / "ci" / "summary.md").read_text()
