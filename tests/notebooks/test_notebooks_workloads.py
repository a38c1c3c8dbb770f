"""The served-workload notebooks (SLO search, shared prefix and multi-turn, metric conventions), executed by
papermill against the kit's simulated server with small parameters; assertions on the files they wrote."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from nbexec import execute

from kit.store import load_results

pytestmark = pytest.mark.slow


def png(path) -> bool:
    return path.exists() and path.read_bytes()[:4] == b"\x89PNG"


def test_how_many_users_within_an_slo():
    out = execute("how-to/how-many-users-within-an-slo.ipynb").out_dir
    s = json.loads((out / "search.json").read_text())
    # simulated TPOT = 4 + 1 ms per other request in flight <= 20.5 ms up to concurrency 17; a loaded machine can
    # only make a probe slower, never faster
    assert s["axis"] == "concurrency" and 8 <= s["answer"] <= 17 and s["bracket"][1] - s["bracket"][0] == 1
    assert s["line"] == (
        f"this server meets TTFT ≤ 2 s and TPOT ≤ 20.5 ms for 90 % of requests up to concurrency {s['answer']}"
    )
    loads = [p["load"] for p in s["probes"]]
    assert loads[:5] == [1, 2, 4, 8] + loads[4:5] and len(loads) == len(set(loads))
    stored = load_results(out / "probes")
    again = json.loads((out / "resumed.json").read_text())
    # the search run again resumes: it measures again only probes whose rows were flagged (e.g. client-bound on a
    # loaded machine: a flagged row is never counted as finished), every other probe is read back
    flagged = sum(1 for p in s["probes"] if p["problems"])  # None when the probe row had no problem
    assert again["measured_again"] >= flagged and (flagged or again["measured_again"] == 0), (again, s["probes"])
    assert len(stored) == len(loads) + again["measured_again"], stored[["point_id", "status", "x_invalid_reasons"]]
    assert set(stored["status"]) == {"ok"} and stored["goodput_rps"].notna().all()
    assert 8 <= again["answer"] <= 17
    assert png(out / "slo_search.png")


def test_shared_prefix_and_multi_turn():
    out = execute("how-to/shared-prefix-and-multi-turn.ipynb").out_dir
    prefix = pd.read_csv(out / "prefix.csv")
    assert list(prefix["x_prefix_fraction"]) == [0.0, 0.5] and list(prefix["concurrency"]) == [2, 2]
    # measured requests 1..8 of groups of 4 (request 0 is the warm-up): 6 of 8 find a half-shared prompt
    assert list(prefix["x_prefix_hit_rate_intended"]) == [0.0, 0.375]
    assert len(load_results(out / "prefix")) == 2
    turns = pd.read_csv(out / "per_turn.csv")
    assert list(turns["turn"]) == [1, 2] and list(turns["n"]) == [4, 4]
    assert turns["input_tokens_mean"].iloc[1] > 2 * turns["input_tokens_mean"].iloc[0]  # the history was resent
    sessions = pd.read_csv(out / "sessions.csv")
    assert len(sessions) == 4 and sessions["completed"].all() and (sessions["turns"] == 2).all()
    replay = load_results(out / "trace")
    assert list(replay["completed"]) == [6] and list(replay["failed"]) == [0]
    assert replay["x_send_late_ms_p50"].iloc[0] >= 0
    assert png(out / "prefix.png") and png(out / "per_turn.png")


def test_metric_conventions():
    out = execute("reference/metric-conventions.ipynb").out_dir
    t = pd.read_csv(out / "conventions.csv").set_index("convention")
    assert len(t) == 7 and t["source"].notna().all() and set(t["quantity"]) == {"ITL", "TPOT", "interactivity"}
    raw, norm = t.loc["raw chunk gaps", "p50"], t.loc["token-normalised gaps", "p50"]
    assert raw == pytest.approx(4 * norm, rel=0.3)  # 4 tokens per chunk
    assert t.loc["raw chunk gaps", "n"] * 4 == t.loc["token-normalised gaps", "n"]
    assert t.loc["1 / p90(E2EL / output tokens)", "p50"] < t.loc["1000 / TPOT per request", "p50"]
    assert png(out / "conventions.png") and len(list(out.glob("requests-*.jsonl"))) == 1
