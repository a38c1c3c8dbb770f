"""The compare view: the pure compare logic on hand-made frames, and the widget view driven by its handlers."""

from __future__ import annotations

import pandas as pd
import pytest

from kit import metrics
from kit.view.compare_view import CompareView, compare_frame, compare_summary, load_sets

PNG = b"\x89PNG"


def _fake_set(accel: str, tok_s: float) -> pd.DataFrame:
    rows = [
        {
            "status": "ok",
            "model": "m",
            "dtype": "bfloat16",
            "accelerator": accel,
            "n_gpus": 1,
            "context_len": c,
            "concurrency": b,
            "decode_tok_s": tok_s * b,
            "tpot_ms_p50": 1000 / tok_s,
        }
        for c in (128, 512)
        for b in (1, 4)
    ]
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
    from kit.store import save_results

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


def test_compare_summary_and_load_sets(tmp_path):
    from kit.errors import InputNotFoundError
    from kit.store import save_results

    a = _fake_set("MI355X", 100.0)
    a.loc[0, "status"] = "oom"
    pa = save_results(a, tmp_path / "a")
    sets = load_sets({"a": pa, "b": save_results(_fake_set("B300", 150.0), tmp_path / "b")})
    assert {k: len(v) for k, v in sets.items()} == {"a": 4, "b": 4}
    s = compare_summary(compare_frame(sets, prices={"a": 2.0, "b": 6.0}))
    assert len(s) == 7  # the OOM point is not summarised as a speed
    assert list(s.columns[:3]) == ["label", "context_len", "concurrency"]
    assert {"decode_tok_s", "tpot_ms_p50", "usd_per_gpu_hr", "usd_per_mtok", "tok_per_usd"} <= set(s.columns)
    assert s.equals(s.sort_values(["label", "context_len", "concurrency"]).reset_index(drop=True))
    with pytest.raises(InputNotFoundError):
        load_sets({"x": tmp_path / "nothing-here"})


def test_compare_view_offers_the_catalog_bases_and_labels_unlabelled_rows(tmp_path):
    from kit.catalog import DEFAULT_BASIS, load_catalog
    from kit.store import save_results

    v = CompareView({"a": save_results(_fake_set("MI355X", 100.0), tmp_path / "a")})
    assert set(v.basis.options) == set(load_catalog().prices["basis"]) and v.basis.value == DEFAULT_BASIS
    p, _lab, _price = v.add_row(str(save_results(_fake_set("B300", 150.0), tmp_path / "b")))
    paths, prices = v.inputs()
    assert list(paths) == ["a", "set 2"] and prices == {}
    v.on_compare()
    assert v.last_error is None and set(v.frame["label"]) == {"a", "set 2"}
    bundle = v._repr_mimebundle_()
    assert "a, set 2" in bundle["text/plain"] and "data:image/png;base64" in bundle["text/html"]


def test_compare_summary_leaves_flagged_rows_out():
    a = _fake_set("MI355X", 100.0)
    a["x_logits_finite"] = [False, True, True, True]
    s = compare_summary(compare_frame({"a": a}))
    assert len(s) == 3 and not ((s.context_len == 128) & (s.concurrency == 1)).any()
