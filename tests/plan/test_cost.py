"""kit.plan.cost: cost columns with price and basis, published Kimi K3 arithmetic, Pareto front, equal interactivity."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kit.plan import cost
from kit.results import to_frame


def _rows(acc="MI355X", n=8, tok_s=(952.0,), conc=(64,)):
    return to_frame(
        [
            {
                "backend": "openai",
                "status": "ok",
                "accelerator": acc,
                "n_gpus": n,
                "concurrency": c,
                "output_tok_s": t,
                "decode_tok_s": t,
            }
            for t, c in zip(tok_s, conc)
        ]
    )


def test_wafer_mi355x_rental_584():
    df = cost.add_cost_columns(_rows(), basis="assumed-rental", tok_s_col="output_tok_s")
    r = df.iloc[0]
    assert r["usd_per_gpu_hr"] == 2.50 and r["price_basis"] == "assumed-rental"
    assert round(r["usd_per_mtok"], 2) == 5.84
    assert r["tok_s_per_gpu"] == 119.0
    assert r["tok_per_usd"] == pytest.approx(952 * 3600 / 20)
    assert r["tok_s_basis"] == "output_tok_s"


def test_published_table_every_basis():
    t = cost.published_cost_table()
    peak = t[t.point == "peak"].set_index(["system", "price_basis"])["usd_per_mtok"].round(2)
    assert peak[("8x MI355X", "assumed-rental")] == 5.84
    assert peak[("8x B300", "assumed-rental")] == 8.50  # 6.00 × 8 / (1568 × 3600) × 1e6
    assert peak[("2x8 B200", "assumed-rental")] == 37.93
    assert peak[("8x MI355X", "tco")] == 3.45
    assert peak[("8x B300", "tco")] == 3.32  # on owning cost the ranking flips
    assert peak[("2x8 B200", "on-demand")] == 40.16
    assert set(t.tok_s_basis) == {"output tokens"}


def test_user_price_overrides_and_is_labelled():
    df = cost.add_cost_columns(_rows(), usd_per_gpu_hr=2.0, tok_s_col="output_tok_s")
    assert df.iloc[0]["price_basis"] == "user" and df.iloc[0]["usd_per_gpu_hr"] == 2.0
    cpu = cost.add_cost_columns(_rows(acc="some-laptop", n=1, tok_s=(100.0,), conc=(1,)), usd_per_gpu_hr=0.1)
    assert cpu.iloc[0]["usd_per_mtok"] == pytest.approx(0.1 / (100 * 3600) * 1e6)


def test_bad_basis_price_and_column():
    with pytest.raises(KeyError, match="assumed-rental"):  # lists the bases that exist for H100
        cost.add_cost_columns(_rows(acc="H100"), basis="assumed-rental")
    with pytest.raises(ValueError, match="must be > 0"):
        cost.add_cost_columns(_rows(), usd_per_gpu_hr=0)
    with pytest.raises(ValueError, match="tok_s_col"):
        cost.add_cost_columns(_rows(), tok_s_col="tokens")
    with pytest.raises(KeyError, match="Z100"):
        cost.add_cost_columns(_rows(acc="Z100"))


def test_missing_throughput_gives_nan_not_error():
    df = to_frame([{"backend": "engine", "status": "oom", "accelerator": "H100", "n_gpus": 1, "concurrency": 64}])
    out = cost.add_cost_columns(df)
    assert math.isnan(out.iloc[0]["usd_per_mtok"]) and out.iloc[0]["price_basis"] == "tco"


def _curve(per_user, per_gpu):
    return pd.DataFrame({"tok_s_per_stream": per_user, "tok_s_per_gpu": per_gpu, "status": "ok"})


def test_pareto_front_drops_dominated():
    df = _curve([100, 50, 40, 20, 10], [10, 40, 30, 80, 90])  # (40, 30) is dominated by (50, 40)
    f = cost.pareto_front(df)
    assert f["tok_s_per_stream"].tolist() == [10, 20, 50, 100]
    assert f["tok_s_per_gpu"].is_monotonic_decreasing


def test_at_interactivity_interpolates_monotonically_and_never_extrapolates():
    df = _curve([100, 50, 20, 10], [10, 40, 80, 90])
    a = cost.at_interactivity(df, [10, 15, 35, 100, 5, 200], usd_per_gpu_hr=2.0)
    assert a["tok_s_per_gpu"].tolist()[:4] == pytest.approx([90, 85, 60, 10])
    assert np.isnan(a["tok_s_per_gpu"].iloc[4]) and np.isnan(a["tok_s_per_gpu"].iloc[5])
    assert a["usd_per_mtok"].iloc[0] == pytest.approx(2.0 / (90 * 3600) * 1e6)
    dense = cost.at_interactivity(df, np.linspace(10, 100, 50))["tok_s_per_gpu"].to_numpy()
    assert (np.diff(dense) <= 1e-12).all()


def test_equal_interactivity_can_flip_the_equal_concurrency_verdict():
    """System A wins at equal concurrency (more tok/s/GPU at each batch size) but its users get slow tokens;
    at the interactivity users need (30 tok/s), B delivers more tok/s/GPU."""
    a = pd.DataFrame(
        {"concurrency": [1, 8, 64], "tok_s_per_stream": [40, 20, 5], "tok_s_per_gpu": [100, 160, 320], "status": "ok"}
    )
    b = pd.DataFrame(
        {"concurrency": [1, 8, 64], "tok_s_per_stream": [90, 60, 30], "tok_s_per_gpu": [60, 120, 150], "status": "ok"}
    )
    assert (a.tok_s_per_gpu > b.tok_s_per_gpu).all()
    c = cost.compare_at_interactivity({"A": a, "B": b}, [30]).set_index("system")["tok_s_per_gpu"]
    assert c["B"] > c["A"]


def test_published_as_results_front():
    df = cost.published_as_results("assumed-rental")
    assert set(df["accelerator"]) == {"MI355X", "B300", "B200"}
    assert set(df["price_basis"]) == {"assumed-rental"}
    cmp = cost.compare_at_interactivity({a: g for a, g in df.groupby("accelerator")}, [20.0, 30.0])
    at30 = cmp[cmp.tok_s_per_stream == 30.0].set_index("system")
    assert at30["usd_per_mtok"].notna().all()
    # B300's published front spans 24.5 (1568 tok/s / 64 users) to 172 tok/s/user: 20 is outside it → NaN
    assert np.isnan(cmp[(cmp.tok_s_per_stream == 20.0) & (cmp.system == "B300")]["usd_per_mtok"]).all()
    tco = cost.published_as_results("tco")
    assert set(tco["price_basis"]) == {"tco"}
