"""kit.serve.conventions: each peer tool's ITL / TPOT / interactivity from one capture: on case E1's request
(exact values), and on the simulated server sending 4 tokens per chunk (raw gaps 4x the per-token figures)."""

import math

import pytest

from kit.serve.conventions import CONVENTIONS, metric_conventions
from kit.serve.load import LoadConfig
from kit.serve.loop import run_coro, run_schedule
from kit.serve.schedule import Arrivals
from kit.serve.simserver import SimModel, SimServer
from kit.serve.workload import fresh_workload
from kit.view.workload_plots import conventions_plot

# case E1: ttft 500 ms, e2el 1000 ms, 6 tokens, chunk gaps [100, 300, 100], token-normalised ITL [100] x 5
E1 = {
    "ok": True,
    "warmup": False,
    "ttft_ms": 500.0,
    "e2el_ms": 1000.0,
    "tpot_ms": 100.0,
    "output_tokens": 6,
    "chunk_gaps_ms": [100.0, 300.0, 100.0],
    "itl_ms": [100.0] * 5,
}


def test_case_e1_under_every_convention():
    t = metric_conventions([E1], {"concurrency": 1, "output_tok_s": 6.0}).set_index("convention")
    assert list(t["quantity"]) == [q for q, *_ in CONVENTIONS] and t["source"].notna().all()
    raw = t.loc["raw chunk gaps"]
    assert raw["p50"] == 100.0 and raw["mean"] == pytest.approx(500 / 3) and raw["n"] == 3
    norm = t.loc["token-normalised gaps"]
    assert norm["mean"] == 100.0 and norm["n"] == 5
    assert t.loc["per-request average (E2EL - TTFT) / (n - 1)", "p50"] == 100.0
    assert t.loc["1000 / TPOT per request", "p50"] == 10.0
    assert t.loc["output tok/s / concurrency", "p50"] == 6.0
    # 1 / p90(1.0 s / 6 tokens) = 6 tok/s: TTFT counted in, so lower than 1000 / TPOT
    assert t.loc["1 / p90(E2EL / output tokens)", "p50"] == pytest.approx(6.0)
    empty = metric_conventions([]).set_index("convention")
    assert math.isnan(empty.loc["raw chunk gaps", "p50"]) and empty.loc["raw chunk gaps", "n"] == 0


@pytest.mark.slow
def test_four_tokens_per_chunk_make_the_conventions_disagree(tmp_path):
    with SimServer(SimModel(ttft_base_ms=20, tpot_base_ms=3, tokens_per_chunk=4)) as sim:
        cfg = LoadConfig(url=sim.url, model="sim", num_requests=4, warmup_requests=0, isl=8, osl=17, max_concurrency=2)
        sched = Arrivals.from_config(cfg, fresh_workload(cfg, 0))
        records, _ = run_coro(run_schedule(cfg, sched, tokenizer=lambda s: len(s.split())))
    t = metric_conventions(records).set_index("convention")
    raw, norm = t.loc["raw chunk gaps", "p50"], t.loc["token-normalised gaps", "p50"]
    assert raw == pytest.approx(4 * norm, rel=0.15) and raw == pytest.approx(12, rel=0.25)
    assert t.loc["raw chunk gaps", "n"] == 4 * 4 and t.loc["token-normalised gaps", "n"] == 4 * 16
    tpot = t.loc["per-request average (E2EL - TTFT) / (n - 1)", "p50"]
    assert tpot == pytest.approx(3.0, rel=0.25)
    assert t.loc["1 / p90(E2EL / output tokens)", "p50"] < t.loc["1000 / TPOT per request", "p50"]
    fig = conventions_plot(t.reset_index())
    fig.savefig(tmp_path / "conventions.png", dpi=80)
    assert (tmp_path / "conventions.png").stat().st_size > 0
