"""kit.serve.slo: the SLO search against the simulated server, whose TPOT grows with concurrency in a known way
(TPOT = 4 + 3 (c - 1) ms), finds the known answer within one bisection step; probes are stored and resumed;
the answer line, the JSON and the goodput-curve figure."""

import json

import pytest

from kit.errors import UserError
from kit.serve.load import LoadConfig
from kit.serve.simserver import SimModel, SimServer
from kit.serve.slo import answer_line, fraction_met, slo_search
from kit.store import load_results
from kit.view.workload_plots import slo_search_plot


@pytest.fixture(scope="module")
def sim():
    with SimServer(SimModel(ttft_base_ms=5, tpot_base_ms=4, tpot_per_request_ms=3)) as s:
        yield s


@pytest.mark.slow
def test_search_finds_the_known_answer_and_resumes(sim, tmp_path):
    # TPOT <= 29.5 ms holds while 4 + 3 (c - 1) <= 29.5, i.e. up to c = 9 (28 ms; c = 10 gives 31 ms)
    cfg = LoadConfig(url=sim.url, model="sim", num_requests=16, warmup_requests=0, isl=8, osl=12, slo_tpot_ms=29.5)
    res = slo_search(cfg, tmp_path, progress=False)
    assert res.answer in (8, 9) and res.bracket[1] - res.bracket[0] == 1  # within one bisection step of 9
    assert list(res.probes["load"][:5]) == [1, 2, 4, 8, 16] and not res.probes["met"].iloc[4]
    assert res.line == f"this server meets TPOT ≤ 29.5 ms for 90 % of requests up to concurrency {res.answer}"
    stored = load_results(tmp_path)
    assert len(stored) == len(res.probes) and set(stored["status"]) == {"ok"}
    assert stored["goodput_rps"].notna().all() and stored["x_fresh_prompts"].all()
    prompts = [json.dumps(x["prompt"]) for x in sim.log]
    assert len(prompts) == len(set(prompts))  # every probe sent fresh prompts
    # a second search on the same directory measures again only probes whose rows were flagged (a flagged row,
    # e.g. client-bound on a loaded machine, is never counted as finished), and gives the same answer
    flagged = {p["point_id"] for p in res.probes.to_dict("records") if p["problems"]}
    n_sent, seen = len(sim.log), []
    again = slo_search(cfg, tmp_path, progress=False, on_point=lambda r, f: seen.append(r))
    assert {r["point_id"] for r in seen} <= flagged and again.answer in (8, 9)
    assert len(sim.log) - n_sent == sum(int(r["completed"]) + int(r["failed"]) for r in seen)
    js = json.loads(json.dumps(res.to_json(), allow_nan=False))  # strict JSON: a probe with no problem is null
    assert js["answer"] == res.answer and js["axis"] == "concurrency" and len(js["probes"]) == len(res.probes)
    fig = slo_search_plot(res.rows, res.answer, slo_fraction=0.9, line=res.line)
    fig.savefig(tmp_path / "slo.png", dpi=80)
    assert (tmp_path / "slo.png").stat().st_size > 0


@pytest.mark.slow
def test_rate_search_and_a_target_no_load_meets(sim, tmp_path):
    cfg = LoadConfig(url=sim.url, model="sim", num_requests=6, warmup_requests=0, isl=8, osl=4, slo_ttft_ms=1.0)
    res = slo_search(cfg, tmp_path / "none", progress=False)
    assert res.answer is None and len(res.probes) == 1
    assert res.line == "this server does not meet TTFT ≤ 1 ms for 90 % of requests even at concurrency 1"
    # every request meets a generous TTFT target: the rate search doubles up to max_load and says so
    cfg = LoadConfig(url=sim.url, model="sim", num_requests=4, warmup_requests=0, isl=8, osl=2, slo_ttft_ms=2000)
    res = slo_search(cfg, tmp_path / "rate", axis="rate", start=10, max_load=40, progress=False)
    assert list(res.probes["load"]) == [10, 20, 40] and res.answer == 40
    assert res.line.endswith("up to 40 requests/s (the largest load probed; it may take more)")
    assert set(load_results(tmp_path / "rate")["request_rate"]) == {10.0, 20.0, 40.0}


def test_bad_searches_are_refused(tmp_path):
    cfg = LoadConfig(url="http://127.0.0.1:9", model="m")
    with pytest.raises(UserError, match="needs at least one"):
        slo_search(cfg, tmp_path)
    cfg.slo_ttft_ms = 100
    with pytest.raises(UserError, match="axis 'users'"):
        slo_search(cfg, tmp_path, axis="users")
    with pytest.raises(UserError, match="slo_fraction=1.5"):
        slo_search(cfg, tmp_path, slo_fraction=1.5)


def test_fraction_met_and_answer_line():
    assert fraction_met({"completed": 8, "failed": 2, "x_good_requests": 9}) == 0.9
    assert fraction_met({"completed": 0, "failed": 0, "x_good_requests": 0}) != fraction_met({})  # NaN
    cfg = LoadConfig(url="http://x", slo_ttft_ms=2000, slo_tpot_ms=50)
    line = answer_line(cfg, "concurrency", 0.9, 48, 64)
    assert line == "this server meets TTFT ≤ 2 s and TPOT ≤ 50 ms for 90 % of requests up to concurrency 48"


@pytest.mark.slow
def test_serve_bench_modes_from_flags(sim, tmp_path):
    """The options of kit serve-bench's modes come from ServedMode; run_mode dispatches each mode to its backend."""
    import argparse

    from kit.cli import add_config_args, config_from_args
    from kit.serve.modes import ServedMode, run_mode

    p = argparse.ArgumentParser()
    add_config_args(p, LoadConfig)
    add_config_args(p, ServedMode)
    base = ["--model", "sim", "--num-requests", "4", "--warmup", "0", "--isl", "8", "--osl", "3"]

    def run(*flags, concs=(1, 2)):
        args = p.parse_args(base + list(flags))
        cfg = config_from_args(LoadConfig, args, url=sim.url, max_concurrency=concs[0])
        return run_mode(config_from_args(ServedMode, args), cfg, concs, tmp_path / "-".join(flags), progress=False)

    df, search = run("--prefix-fraction", "0,0.5", "--prefix-group-size", "2")
    assert search is None and list(df["x_prefix_fraction"]) == [0.0, 0.0, 0.5, 0.5] and (df["status"] == "ok").all()
    df, search = run("--search", "concurrency", "--slo-tpot-ms", "29.5", "--slo-fraction", "0.75", "--max-load", "4")
    assert search.answer == 4 and search.slo_fraction == 0.75 and len(df) == 3
    df, _ = run("--turns", "2", "--think-time-s", "0.01", concs=(2,))
    assert list(df["x_turns"]) == [2] and list(df["completed"]) == [4]
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(json.dumps({"timestamp": 10 * i, "input_length": 5, "output_length": 2}) + "\n" for i in range(3))
    )
    df, _ = run("--trace", str(trace), "--time-scale", "0.5")
    assert list(df["completed"]) == [3] and list(df["x_time_scale"]) == [0.5]
    for bad in (["--trace", str(trace), "--turns", "2"], ["--turns", "2", "--prefix-fraction", "0.5"]):
        with pytest.raises(UserError):
            run(*bad)
    with pytest.raises(SystemExit):
        p.parse_args(base + ["--prefix-fraction", "1.5"])
