"""kit qualify without measuring (issue 24): the budget and threshold parsing, every verdict function on fake
figures, the cluster's outlier, user errors (exit 2) and resume after an interrupt through the real grid runner
with stand-in items."""

from __future__ import annotations

import json
import shutil

import pytest

from kit.cli import main
from kit.errors import UserError
from kit.qualification import run as qrun
from kit.qualification.cluster import compare_nodes
from kit.qualification.config import ITEMS, QualifyConfig, Thresholds, parse_budget, plan
from kit.qualification.context import ItemResult, headline
from kit.qualification.node import qualify
from kit.qualification.verdicts import (
    Verdict,
    calibrate_verdict,
    comm_verdict,
    exit_code,
    kv_verdict,
    ops_verdict,
    overall,
    planner_verdict,
    points_verdict,
    power_verdict,
    with_overrun,
)

TH = Thresholds()


def test_budget_is_parsed_strictly():
    assert parse_budget("90s") == 90 and parse_budget("5m") == 300 and parse_budget("1h30m") == 5400
    assert parse_budget("1.5h") == 5400 and parse_budget(" 2M ") == 120
    for bad in ("5", "5 minutes", "5x", "m", "", "0s", "30s5m", "5m5m", "8d", "-5m", "1e3s", "200h"):
        with pytest.raises(UserError, match="budget"):
            parse_budget(bad)


def test_thresholds_have_sources_and_strict_overrides():
    assert "torch.testing" in Thresholds.source("ops_max_mismatches")
    t = TH.with_overrides(["kv_shortfall=0.25"])
    assert t.kv_shortfall == 0.25 and TH.kv_shortfall == 0.10
    with pytest.raises(UserError, match="unknown threshold; known: ops_max_mismatches"):
        TH.with_overrides(["nope=1"])
    for bad in ("kv_shortfall=abc", "kv_shortfall=-1", "kv_shortfall=nan", "kv_shortfall"):
        with pytest.raises(UserError, match="give a fraction from 0 to 1"):
            TH.with_overrides([bad])


def cell(op="top_p_renorm_prob", mode="eager", n=3):
    return {"op": op, "dtype": "float32", "mode": mode, "input": "edge", "mismatches": n, "detail": "row 0"}


def test_ops_verdict_names_the_op_and_tells_compiled_from_eager():
    base = {"cells": 56, "eager_failed": [], "compile_failed": [], "not_compiled": []}
    assert ops_verdict(base, TH).verdict == "pass"
    v = ops_verdict({**base, "eager_failed": [cell()]}, TH)
    assert v.verdict == "fail" and "differs from the reference: top_p_renorm_prob float32 eager" in v.reason
    assert "mismatches <= 0" in v.threshold
    v = ops_verdict({**base, "compile_failed": [cell("top_k_renorm_prob", "compile")]}, TH)
    assert (
        v.verdict == "fail"
        and v.reason.startswith("compiled differs from eager")
        and "compiled == eager" in v.threshold
    )
    v = ops_verdict({**base, "library_not_checked": {"sampling_from_probs": "flashinfer's sampler ..."}}, TH)
    assert v.verdict == "warn" and "not checked: sampling_from_probs: flashinfer" in v.reason
    v = ops_verdict({**base, "compile_capped": ["min_p_renorm_prob"]}, TH)
    assert v.verdict == "pass" and "compiled for all but min_p_renorm_prob (--compile-ops)" in v.reason
    v = ops_verdict({**base, "not_compiled": ["min_p_renorm_prob"]}, TH)
    assert v.verdict == "warn" and "min_p_renorm_prob" in v.reason
    assert (
        ops_verdict({**base, "eager_failed": [cell(n=3)]}, TH.with_overrides({"ops_max_mismatches": 5})).verdict
        == "pass"
    )


def test_points_verdict():
    fig = {"planned": 3, "ran": 3, "bad": [], "headline": "c=1: 10 tok/s"}
    assert points_verdict(fig, 0, "seed").verdict == "pass"
    v = points_verdict({**fig, "bad": [{"label": "c=64", "verdict": "oom", "reason": "OutOfMemoryError"}]}, 0, "seed")
    assert v.verdict == "fail" and "c=64: oom (OutOfMemoryError)" in v.reason
    assert points_verdict({**fig, "ran": 2}, 0, "seed").verdict == "warn"
    assert points_verdict({**fig, "ran": 0}, 0, "seed").verdict == "skip"


def test_kv_verdict():
    fig = {"largest_ok": 7800, "target": 8192, "target_source": "cap", "smallest_failed": None, "done": True}
    assert kv_verdict(fig, TH).verdict == "pass"
    v = kv_verdict({**fig, "largest_ok": 2048, "smallest_failed": 4096, "failed_status": "refused"}, TH)
    assert v.verdict == "fail" and "2,048 tokens < 7,373" in v.reason and "4,096 tokens did not (refused)" in v.reason
    assert kv_verdict({**fig, "largest_ok": None}, TH).reason.startswith("no context decoded")
    assert kv_verdict({**fig, "largest_ok": 2048, "done": False}, TH).verdict == "warn"
    bad_check = {"ok": False, "context_len": 1024, "max_abs_err": 0.5}
    assert kv_verdict({**fig, "check": bad_check}, TH).verdict == "fail"


def test_device_verdicts():
    comm = {"busbw_gb_s": 100.0, "catalog_busbw_gb_s": 470.0, "ranks": 8, "backend": "nccl"}
    assert comm_verdict(comm, TH).verdict == "fail"
    assert comm_verdict({**comm, "busbw_gb_s": 400.0}, TH).verdict == "pass"
    assert "not judged" in comm_verdict({**comm, "catalog_busbw_gb_s": None}, TH).reason
    pw = {
        "status": "ok: nvml",
        "j_per_output_token": 0.5,
        "avg_power_w": 600.0,
        "pct_tdp_max": 80.0,
        "throttled": False,
    }
    assert power_verdict(pw, TH).verdict == "pass"
    assert power_verdict({**pw, "throttled": True}, TH).verdict == "warn"
    assert power_verdict({**pw, "pct_tdp_max": 120.0}, TH).verdict == "warn"
    v = power_verdict({**pw, "status": "not available: no RAPL zone"}, TH)
    assert v.verdict == "skip" and "no RAPL zone" in v.reason
    cal = {"copy_gb_s": 1000.0, "catalog_gb_s": 4800.0, "tflops": 700.0, "catalog_tflops": 989.0, "dtype": "bfloat16"}
    assert "copy 1000 GB/s < 0.5 x 4800" in calibrate_verdict(cal, TH).reason
    assert calibrate_verdict({**cal, "copy_gb_s": 4000.0}, TH).verdict == "pass"
    assert calibrate_verdict({**cal, "copy_gb_s": 4000.0, "tflops": 100.0}, TH).verdict == "fail"
    assert "not judged" in calibrate_verdict({**cal, "catalog_gb_s": None}, TH).reason
    pl = {"worst_ratio": 0.9, "worst_label": "c=64", "points": 3}
    assert [planner_verdict({**pl, "worst_ratio": r}, TH).verdict for r in (0.9, 0.6, 0.3)] == ["pass", "warn", "fail"]


def test_overall_exit_code_and_overrun():
    assert overall(["pass", "skip", "warn"]) == "warn" and exit_code(["pass", "skip", "warn"]) == 0
    assert overall(["pass", "fail"]) == "fail" and exit_code(["pass", "fail"]) == 1
    v = with_overrun(Verdict("pass", "ok", "rule"), 100, 30, TH)
    assert v.verdict == "warn" and "took 100 s of a 30 s share" in v.reason
    assert with_overrun(Verdict("pass", "ok"), 40, 30, TH).verdict == "pass"


def node(name, items):
    return {"node": name, "host": "h", "overall": "pass", "exit_code": int(any(v == "fail" for v, _ in items.values())),
            "out": "o", "report": "r",
            "items": [{"item": k, "verdict": v, "reason": "",
                       "headline": headline("J/token" if k == "power" else "tok/s", x, "u", k != "power")}
                      for k, (v, x) in items.items()]}  # fmt: skip


def test_cluster_names_the_outlier_per_item():
    nodes = [node("node-0", {"seed": ("pass", 100.0), "ops": ("pass", 56)}),
             node("node-1", {"seed": ("pass", 102.0), "ops": ("pass", 56)}),
             node("node-2", {"seed": ("pass", 70.0), "ops": ("fail", 50)})]  # fmt: skip
    c = compare_nodes(nodes)
    by = {i["item"]: i for i in c["items"]}
    assert by["seed"]["outlier"] == "node-2" and "30% from the median 100" in by["seed"]["why"]
    assert by["ops"]["outlier"] == "node-2" and "fails where 2 other node(s) do not" in by["ops"]["why"]
    assert c["exit_code"] == 1
    c = compare_nodes(nodes[:2])
    assert [i["outlier"] for i in c["items"]] == [None, None] and c["exit_code"] == 0
    # two nodes are equally far from their median: the worse one is named (lower tok/s, higher J/token)
    two = [node("node-0", {"seed": ("pass", 80.0), "power": ("pass", 0.5)}),
           node("node-1", {"seed": ("pass", 100.0), "power": ("pass", 0.8)})]  # fmt: skip
    assert [i["outlier"] for i in compare_nodes(two)["items"]] == ["node-0", "node-1"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--budget", "5"], "budget '5' is not a duration"),
        (["--budget", "0m"], "more than 0 s"),
        (["--items", "doctor,gpu"], "give a comma list of doctor"),
        (["--threshold", "kv_shortfal=0.2"], "unknown threshold"),
        (["--url", "http://127.0.0.1:9", "--launch", "vllm"], "not both"),
        (["--launch", "sglang"], "needs --served-model"),
        (["--rdzv-endpoint", "127.0.0.1:29500"], "go with --nodes N"),
        (["--nodes", "2", "--executor", "local", "--partition", "gpu"], "Slurm settings"),
        (["--op-impl", "top_p_renorm_prob=no_such_module:f"], "does not import"),
        (["--op-impl", "top_q=kit.check.planted:f"], "unknown op 'top_q'"),
        (["--concurrency", "0"], "too small"),
        # bad values an item would only meet once it ran: refused before any item (issue 31)
        (["--model", "no-such-model"], "no-such-model"),
        (["--model", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
        (["--dtype", "float99"], "float99"),
        (["--isl", "99999999999"], "99999999999"),
        (["--url", "not-a-url"], "not-a-url"),
        (["--threads", "100000"], "threads=100000"),
        (["--compile-timeout", "1e9"], "compile_timeout_s=1000000000.0"),
        (["--nodes", "1000000", "--executor", "local"], "--nodes 1000000: the local executor takes 1 to 8"),
        (["--nodes", "5000"], "--nodes 5000: the slurm executor takes 1 to 1024"),
        (["--threshold", "kv_shortfall=1e308"], "give a fraction from 0 to 1"),
        (["--threshold", "overrun_warn=0.5"], "give a number from 1 to 1000"),
        (["--threshold", "planner_fail_fraction=0.9"], "above planner_warn_fraction=0.8"),
    ],
)
def test_user_errors_exit_2_with_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(qrun, "RUNNERS", {})  # an item that ran would raise KeyError: nothing may run
    try:
        rc = main(["qualify", "--out", str(tmp_path / "q"), *argv])
    except SystemExit as e:  # argparse's own exit for a bad option value
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "q" / "items").exists()  # nothing ran


def fake_runners(calls, interrupt_at=None):
    def make(name):
        def run(ctx):
            calls.append(name)
            if name == interrupt_at:
                raise KeyboardInterrupt
            if name == "comm":
                return ItemResult(Verdict("skip", "1 device"))
            v = "fail" if name == "kv" else "pass"
            return ItemResult(Verdict(v, f"{name} {v}", "rule"), {"n": 1}, None, {}, headline("x", 1.0, "u"))

        return run

    return {n: make(n) for n in ITEMS}


def test_an_interrupt_keeps_finished_items_and_a_rerun_resumes_them(tmp_path, monkeypatch):
    calls = []
    cfg = QualifyConfig(out=str(tmp_path / "q"), budget_s=60)
    monkeypatch.setattr(qrun, "RUNNERS", fake_runners(calls, interrupt_at="kv"))
    with pytest.raises(KeyboardInterrupt):
        qrun.run_items(cfg, echo=lambda *_: None)
    assert calls == ["doctor", "ops", "seed", "served", "kv"]
    logged = [json.loads(x) for x in (tmp_path / "q" / "items" / "points.jsonl").read_text().splitlines()]
    assert [r["x_item"] for r in logged] == ["doctor", "ops", "seed", "served"]  # each recorded as it finished
    calls.clear()
    monkeypatch.setattr(qrun, "RUNNERS", fake_runners(calls))
    _, items, _ = qrun.run_items(cfg, echo=lambda *_: None)
    assert calls == ["kv", "comm", "power", "calibrate", "planner"]  # the finished four are not run again
    assert [i["verdict"] for i in items] == ["pass"] * 4 + ["fail", "skip"] + ["pass"] * 3
    calls.clear()
    qrun.run_items(cfg, echo=lambda *_: None)
    assert calls == ["kv", "comm"]  # a failed item and a skipped one are looked at again; the rest is finished


def test_list_thresholds_prints_each_with_its_source(capsys):
    assert main(["qualify", "--list-thresholds"]) == 0
    out = capsys.readouterr().out
    for name in ("ops_max_mismatches", "kv_shortfall", "comm_min_busbw_fraction", "cluster_outlier_fraction"):
        assert f"{name} = {getattr(TH, name):g}\n    {Thresholds.source(name)}" in out


def test_slurm_without_srun_is_a_user_error_suggesting_the_local_executor(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert main(["qualify", "--out", str(tmp_path / "q"), "--nodes", "2"]) == 2
    err = capsys.readouterr().err
    assert "no srun on this machine" in err and "--executor local" in err and err.count("\n") == 1
    assert not (tmp_path / "q").exists()


def test_thresholds_are_checked_against_their_own_range():
    assert Thresholds.allowed("kv_shortfall") == (0.0, 1.0) and Thresholds.allowed("overrun_warn")[0] == 1.0
    assert TH.with_overrides(["kv_shortfall=1", "ops_max_mismatches=40"]).ops_max_mismatches == 40
    for bad in ("kv_shortfall=1.01", "comm_min_busbw_fraction=2", "cluster_outlier_fraction=1e308"):
        with pytest.raises(UserError, match=r"give a fraction from 0 to 1"):
            TH.with_overrides([bad])
    with pytest.raises(UserError, match=r"planner_high_ratio='0.5': give a number from 1 to 100"):
        TH.with_overrides(["planner_high_ratio=0.5"])


def test_nothing_checked_never_reads_pass():
    assert overall(["skip"] * 9) == "warn" and exit_code(["skip"] * 9) == 1
    assert overall([]) == "warn" and exit_code([]) == 1
    assert overall(["skip", "pass"]) == "pass" and exit_code(["skip", "pass"]) == 0


def test_the_budget_clock_starts_with_the_first_item(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(qrun.time, "monotonic", lambda: now[0])
    cfg = QualifyConfig(out=str(tmp_path / "q"), budget_s=10).validate()
    backend = qrun.QualifyBackend(cfg, plan(cfg), tmp_path / "q")
    now[0] += 30.0  # start-up (imports, device detection) longer than the whole budget
    assert backend.share_s("doctor") == pytest.approx(10 * ITEMS["doctor"] / sum(ITEMS.values()))
    now[0] += 10.0
    assert backend.share_s("ops") == 0.0  # from then on the clock runs


def fake_runners_with(verdicts: dict, raises: str | None = None):
    def make(name):
        def run(ctx):
            if name == raises:
                raise RuntimeError(f"{name} broke")
            v = verdicts.get(name, "pass")
            return ItemResult(Verdict(v, f"{name} said {v}", "rule"), {"n": 1})

        return run

    return {n: make(n) for n in ITEMS}


def test_every_verdict_is_printed_at_the_end_with_fail_reasons_and_kept_marks(tmp_path, monkeypatch):
    cfg = QualifyConfig(out=str(tmp_path / "q"), budget_s=60)
    monkeypatch.setattr(qrun, "RUNNERS", fake_runners_with({"kv": "fail", "served": "skip"}, raises="comm"))
    lines = []
    s = qualify(cfg, echo=lines.append)
    assert s["exit_code"] == 1
    end = lines[-10:-1]  # the nine verdicts, then the overall line
    assert [x.split(":")[1].strip() for x in end] == list(ITEMS)
    assert "kit qualify: kv: FAIL — kv said fail" in end and not any("kept" in x for x in end)
    assert any(x.startswith("kit qualify: comm: FAIL — the item raised:") and "comm broke" in x for x in end)
    lines.clear()
    qualify(cfg, echo=lines.append)
    end = lines[-10:-1]
    assert "kit qualify: doctor: PASS — doctor said pass (kept from the earlier run)" in end
    assert "kit qualify: kv: FAIL — kv said fail" in end  # a failed item ran again: not kept
    assert [i for i in qualify(cfg, echo=None)["items"] if i["kept"]][0]["item"] == "doctor"


def test_a_run_of_skips_says_nothing_was_checked_and_exits_1(tmp_path, monkeypatch):
    monkeypatch.setattr(qrun, "RUNNERS", fake_runners_with(dict.fromkeys(ITEMS, "skip")))
    lines = []
    s = qualify(QualifyConfig(out=str(tmp_path / "q"), budget_s=60), echo=lines.append)
    assert (s["overall"], s["exit_code"]) == ("warn", 1)
    assert any("nothing was checked" in x for x in lines) and lines[-1].startswith("kit qualify: WARN")


def test_threads_and_compile_timeout_reach_the_items(tmp_path, monkeypatch):
    from kit.check import doctor
    from kit.cli import build_parser
    from kit.qualification import items_check
    from kit.qualification.cli import config_from
    from kit.qualification.context import ItemContext
    from kit.qualification.items_load import seed_sweep_config

    args = build_parser("qualify").parse_args(
        ["qualify", "--threads", "1", "--compile-timeout", "7", "--out", str(tmp_path)]
    )
    cfg = config_from(args)
    p = plan(cfg)
    assert seed_sweep_config(cfg, p).threads == 1 and cfg.compile_timeout_s == 7.0
    seen = {}
    fnuz = "casting an out-of-range value to float8_e4m3fnuz gives NaN here: clamp to ±240 first (kit.check.fp8.to_fp8)"

    def fake_doctor(dc):
        seen["timeout"], seen["check"] = dc.compile_timeout_s, dc.compile_check
        return {"device": {"name": "cpu", "count": 1}, "torch": {"version": "x"}, "dtypes": [],
                "fp8": {"native_format": "e4m3fn"}, "compile": {"checked": True, "ok": True}, "packages": {},
                "problems": [], "warnings": [fnuz]}  # fmt: skip

    monkeypatch.setattr(doctor, "run_doctor", fake_doctor)
    ctx = ItemContext("doctor", cfg, p, tmp_path, 2.0, 0.0)  # a 2 s share: --compile-timeout still wins
    res = items_check.run_doctor_item(ctx)
    assert seen == {"timeout": 7.0, "check": True}
    # the fnuz NaN cast is documented format behaviour: a note in the figures, not a warning
    assert res.verdict.verdict == "pass" and res.figures["notes"] == [fnuz] and res.figures["warnings"] == []
    real = "torch.compile check did not finish within 7 s"
    assert items_check.expected_notes([fnuz, real]) == [fnuz]


def test_planner_verdict_is_two_sided_noise_aware_and_one_run_only():
    pl = {"worst_ratio": 0.9, "worst_label": "c=1", "best_ratio": 0.95, "best_label": "c=8", "points": 3}
    assert planner_verdict(pl, TH).verdict == "pass"
    v = planner_verdict({**pl, "worst_ratio": 1.3, "best_ratio": 1.76}, TH)
    assert v.verdict == "warn" and "176% at c=8" in v.reason and "above the prediction" in v.reason
    v = planner_verdict({**pl, "worst_ratio": 0.41, "noisy": "noisy machine: TPOT p50 is up to 5x"}, TH)
    assert v.verdict == "warn" and "at most a warn: noisy machine" in v.reason
    v = planner_verdict({**pl, "worst_ratio": 0.41, "mixed": "the seed workload is from the earlier run r1"}, TH)
    assert v.verdict == "warn" and v.reason.startswith("not judged: the seed workload is from the earlier run r1")
    assert planner_verdict({**pl, "worst_ratio": 0.41}, TH).verdict == "fail"


def test_planner_figures_know_noise_and_mixed_runs(tmp_path):
    import pandas as pd

    from kit.qualification.context import THIS_RUN, ItemContext
    from kit.qualification.items_device import machine_noise, mixed_runs

    rows = pd.DataFrame({"status": ["ok", "ok"], "tpot_ms_p50": [10.0, 10.0], "tpot_ms_min": [9.0, 9.5],
                         "x_threads_reason": ["2 of 2 cores free at the start"] * 2, "run_id": ["a", "a"]})  # fmt: skip
    assert machine_noise(rows) is None
    assert "noisy machine" in machine_noise(rows.assign(tpot_ms_p50=[40.0, 10.0]))
    busy = "1 of 2 cores free at the start (1.0 cores busy with other work)"
    assert machine_noise(rows.assign(x_threads_reason=[busy, busy])) == f"busy machine: {busy}"
    cfg = QualifyConfig(out=str(tmp_path))

    def ctx(origins):
        return ItemContext("planner", cfg, None, tmp_path, 1.0, 0.0, origins)

    assert mixed_runs(ctx({"seed": THIS_RUN, "calibrate": THIS_RUN}), rows) is None
    assert mixed_runs(ctx({"seed": "r1", "calibrate": "r1"}), rows) is None
    why = mixed_runs(ctx({"seed": "r1", "calibrate": THIS_RUN}), rows)
    assert why == "the seed workload is from the earlier run r1, the calibration from this run"
    assert "2 runs" in mixed_runs(ctx({}), rows.assign(run_id=["a", "b"]))
