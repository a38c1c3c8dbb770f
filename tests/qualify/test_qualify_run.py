"""kit qualify for real on this CPU (issue 24): ONE qualification with a 1-minute budget (every item run or skipped
with a reason, the served item against the scripted SSE server) shared by several checks — the report, the raw
run directories, the history rows and the page in headless Chromium; a planted fault of each kind failing its item
with exit 1 (the next qualification saying how it compares with the previous one); two "nodes" through submitit's
local executor and their comparison page. The screenshot is ``test-artifacts/qualify-report.png``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sse_server import start_in_thread

from kit.cli import main
from kit.qualification.config import ITEMS, QualifyConfig, Thresholds

pytestmark = pytest.mark.slow
CHROMIUM = os.environ.get("KIT_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
#: the planner's fail line lowered for this shared 2-core machine, where a neighbour's load moves measured decode
#: far from the calibrated prediction; the verdict rule itself is tested in test_qualify_units.py
LENIENT = Thresholds(planner_fail_fraction=0.05, planner_warn_fraction=0.5)


@pytest.fixture(scope="module")
def server():
    srv = start_in_thread()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def qualified(server, tmp_path_factory):
    """One qualification of this CPU: 60 s budget, eager-only op checks, the served item against the scripted
    server, one row per item in a history database."""
    from kit.qualification.node import qualify

    base = tmp_path_factory.mktemp("qualify")
    cfg = QualifyConfig(out=str(base / "q"), budget_s=60, url=server.url, served_model="normal", compile_ops=0,
                        db=str(base / "history.duckdb"), thresholds=LENIENT)  # fmt: skip
    lines = []
    s = qualify(cfg, echo=lines.append)
    return s, base, lines


def test_every_item_runs_or_is_skipped_with_a_reason_and_nothing_fails(qualified):
    s, base, lines = qualified
    items = {i["item"]: i for i in s["items"]}
    assert list(items) == list(ITEMS)
    assert s["exit_code"] == 0 and s["overall"] in ("pass", "warn"), [(i["item"], i["reason"]) for i in s["items"]]
    for i in s["items"]:
        assert i["verdict"] in ("pass", "warn", "skip") and i["reason"]
        assert i["verdict"] == "skip" or i["threshold"]  # what decided it is named
    assert items["served"]["verdict"] == "pass" and items["seed"]["verdict"] in ("pass", "warn")
    assert items["comm"]["verdict"] == "skip" and "2 gloo ranks would cost more" in items["comm"]["reason"]
    assert items["power"]["verdict"] == "skip" and "no power reader" in items["power"]["reason"]
    assert items["ops"]["verdict"] == "pass" and "eager only" in items["ops"]["reason"]
    assert items["kv"]["figures"]["largest_ok"] and items["planner"]["figures"]["points"] == 3
    assert any("model: tiny-llama in float32" in ln for ln in lines)  # every choice printed


def test_report_json_and_raw_run_directories(qualified):
    s, base, _ = qualified
    out = base / "q"
    saved = json.loads((out / "qualify.json").read_text())
    assert [i["verdict"] for i in saved["items"]] == [i["verdict"] for i in s["items"]]
    assert saved["machine"]["torch"] and saved["machine"]["host"] and saved["plan"]["choices"]
    for d in ("seed", "served", "kv", "items"):
        assert (out / d / "points.jsonl").exists() and (out / d / "results.parquet").exists(), d
    assert (out / "calibrate" / "calibration-cpu.json").exists() and (out / "ops" / "op_checks.csv").exists()
    plots = [p for i in saved["items"] for p in i["plots"].values()]
    assert len(plots) >= 5 and all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in plots)


def test_history_has_a_row_per_item(qualified):
    from kit.track.db import load_rows

    s, base, _ = qualified
    rows = load_rows(base / "history.duckdb")
    q = rows[rows["backend"] == "qualify"]
    assert sorted(json.loads(j)["x_item"] for j in q["row_json"]) == sorted(ITEMS)
    assert s["comparison"] is None  # the first qualification in this database


def test_report_in_headless_chromium(qualified):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"missing {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    s, base, _ = qualified
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.goto(Path(s["report"]).resolve().as_uri())
            assert page.evaluate("() => document.querySelector('table').className") == "kit-verdicts"  # first
            rows = page.locator("table.kit-verdicts tbody tr")
            assert rows.count() == len(ITEMS)
            assert page.locator("table.kit-verdicts td.v-skip").count() == 2  # comm, power
            assert page.locator("#overall").inner_text() == s["overall"].upper()
            imgs = page.locator("img.kit-plot")
            assert imgs.count() >= 5
            assert page.evaluate("() => [...document.images].every(i => i.naturalWidth > 200)")
            assert page.locator("#machine").is_visible()
            page.screenshot(path=str(ARTIFACTS / "qualify-report.png"), full_page=False)
        finally:
            browser.close()


def qualify_cli(tmp_path, *argv):
    rc = main(["qualify", "--budget", "1m", "--out", str(tmp_path / "q"), *argv])
    return rc, json.loads((tmp_path / "q" / "qualify.json").read_text())


def the(summary, item):
    return next(i for i in summary["items"] if i["item"] == item)


def test_wrong_probabilities_fail_the_ops_item_and_the_next_run_compares(qualified, tmp_path, capsys):
    _, base, _ = qualified
    planted = "top_p_renorm_prob=kit.check.planted:top_p_renorm_prob_drops_crossing_token"
    db = str(base / "history.duckdb")
    rc, s = qualify_cli(tmp_path, "--items", "ops", "--compile-ops", "0", "--db", db, "--op-impl", planted)
    ops = the(s, "ops")
    assert rc == 1 and ops["verdict"] == "fail"
    assert ops["reason"].startswith("differs from the reference: top_p_renorm_prob")
    out = capsys.readouterr().out
    assert "compared with the previous qualification" in out and "ops pass -> fail" in out
    assert s["comparison"]["items"][0]["before"] == "pass"


def test_a_compiled_path_that_differs_from_eager_fails(tmp_path):
    planted = "top_k_renorm_prob=kit.check.planted:top_k_renorm_prob_wrong_when_compiled"
    rc, s = qualify_cli(tmp_path, "--items", "ops", "--compile-ops", "1", "--op-impl", planted)
    ops = the(s, "ops")
    assert rc == 1 and ops["reason"].startswith("compiled differs from eager (eager matches the reference)")
    assert "top_k_renorm_prob float32 compile" in ops["reason"]


def test_an_endpoint_that_errors_mid_stream_fails(server, tmp_path):
    rc, s = qualify_cli(tmp_path, "--items", "served", "--url", server.url, "--served-model", "e6")
    served = the(s, "served")
    assert rc == 1 and served["verdict"] == "fail"
    assert "c=1: error (8 of 8 requests failed: error event: engine overloaded)" in served["reason"]


def test_a_kv_budget_too_small_fails(tmp_path):
    rc, s = qualify_cli(tmp_path, "--items", "kv", "--kv-budget-gb", "0.03")
    kv = the(s, "kv")
    assert rc == 1 and kv["verdict"] == "fail" and "target 8,192" in kv["reason"], kv["reason"]
    assert "--kv-budget-gb" in kv["threshold"]


def test_two_nodes_through_submitit_local_and_their_comparison_page(tmp_path):
    """Two tasks of one local submitit job (each a process of its own), each qualifying its "node" into
    OUT/node-<rank> — ops, and collectives across the two nodes over one torchrun rendezvous — then the
    comparison page."""
    from kit._io import free_port
    from kit.qualification.cluster import ClusterConfig, qualify_cluster

    cfg = QualifyConfig(out=str(tmp_path / "c"), budget_s=60, items=("ops", "comm"), compile_ops=0,
                        rdzv_endpoint=f"127.0.0.1:{free_port()}")  # fmt: skip
    c = qualify_cluster(cfg, ClusterConfig(2, "local"), echo=lambda *_: None)
    assert [n["node"] for n in c["nodes"]] == ["node-0", "node-1"] and c["exit_code"] == 0
    for n in ("node-0", "node-1"):
        assert (tmp_path / "c" / n / "index.html").exists() and (tmp_path / "c" / n / "ops" / "op_checks.csv").exists()
    ops, comm = c["items"]
    assert [r["value"] for r in ops["nodes"]] == [42.0, 42.0] and ops["outlier"] is None and "within 10%" in ops["why"]
    assert [r["verdict"] for r in comm["nodes"]] == ["pass", "pass"]
    reasons = sorted(r["reason"] for r in comm["nodes"])  # one node holds global rank 0 and its figures
    assert "over 2 gloo ranks" in reasons[0] and reasons[1].startswith("took part in the 2-rank probe over 2 nodes")
    page = (tmp_path / "c" / "cluster.html").read_text()
    assert page.count("<th>node-") == 2 and "data:image/png;base64," in page and 'href="node-1/index.html"' in page
    assert json.loads((tmp_path / "c" / "cluster.json").read_text())["items"][1]["item"] == "comm"
