"""kit.serve.workload and the served sweep: fresh prompts per sweep point (case E8) and prefix-shared workloads,
against the simulated server (kit.serve.simserver), which logs every prompt it receives and reports the
prefix-cache hits it served."""

import json

import pytest

from kit.errors import UserError
from kit.grid import run_grid
from kit.serve.aggregate import achieved_hit_rate
from kit.serve.load import LoadConfig
from kit.serve.simserver import SimModel, SimServer
from kit.serve.sweep import ServedBackend
from kit.serve.workload import PromptSpec, build_workload, fresh_workload, intended_hit_rate
from kit.store import load_results
from kit.view.workload_plots import prefix_plot


@pytest.fixture(scope="module")
def sim():
    with SimServer(SimModel(ttft_base_ms=5, tpot_base_ms=2, block_tokens=8)) as s:
        yield s


@pytest.mark.slow
def test_e8_no_prompt_is_sent_twice_across_a_two_concurrency_sweep(sim, tmp_path):
    """Case E8: concurrency [1, 2], 4 measured + 1 warm-up each -> 10 distinct prompts of 10 sent."""
    sim.log.clear()
    cfg = LoadConfig(url=sim.url, model="sim", num_requests=4, warmup_requests=1, isl=16, osl=4, seed=3)
    df = run_grid(ServedBackend(cfg, [1, 2], tmp_path), tmp_path, progress=False)
    prompts = [json.dumps(x["prompt"]) for x in sim.log]
    assert len(prompts) == 10 and len(set(prompts)) == 10
    assert sum(x["cached"] for x in sim.log) == 0  # nothing for a prefix cache to serve
    assert list(df["status"]) == ["ok", "ok"] and list(df["completed"]) == [4, 4]
    assert df["x_fresh_prompts"].all() and (df["x_prefix_hit_rate_intended"] == 0).all()
    # measured again (no resume): the same point sends its same prompts, still distinct from the other point's
    sim.log.clear()
    run_grid(ServedBackend(cfg, [1, 2], tmp_path), tmp_path, progress=False, resume=False)
    assert sorted(prompts) == sorted(json.dumps(x["prompt"]) for x in sim.log)


def test_fresh_workload_is_keyed_by_point_and_deterministic():
    cfg = LoadConfig(url="http://x", num_requests=3, warmup_requests=1, isl=12, osl=5, seed=1)
    a, a2, b = fresh_workload(cfg, "p1"), fresh_workload(cfg, "p1"), fresh_workload(cfg, "p2")
    assert [r.prompt for r in a] == [r.prompt for r in a2]
    unpinned = LoadConfig(url="http://x", num_requests=3, warmup_requests=1, isl=12, osl=5)  # seed None: new
    assert [r.prompt for r in fresh_workload(unpinned, "p1")] != [r.prompt for r in fresh_workload(unpinned, "p1")]
    assert not {tuple(r.prompt) for r in a} & {tuple(r.prompt) for r in b}
    assert len(a) == 4 and all(len(r.prompt) == 12 and r.max_tokens == 5 for r in a)
    ranged = fresh_workload(
        LoadConfig(url="http://x", num_requests=64, isl=100, osl=50, isl_range=0.2, osl_range=0.5), 1
    )
    assert {len(r.prompt) for r in ranged} <= set(range(80, 121)) and len({len(r.prompt) for r in ranged}) > 5
    assert {r.max_tokens for r in ranged} <= set(range(25, 76)) and len({r.max_tokens for r in ranged}) > 5
    chat = fresh_workload(LoadConfig(url="http://x", endpoint="chat", num_requests=2, isl=6), 0)
    assert all(isinstance(r.prompt, str) and len(r.prompt.split()) == 6 and r.input_tokens is None for r in chat)


def test_prefix_groups_share_exactly_the_prefix():
    wl = build_workload(10, PromptSpec(20, 4, prefix_fraction=0.5, group_size=4), seed=3, as_token_ids=True)
    heads = [tuple(r.prompt[:10]) for r in wl]
    assert len(set(heads[:4])) == 1 and len(set(heads[4:8])) == 1 and heads[0] != heads[4] != heads[8]
    assert len({tuple(r.prompt) for r in wl}) == 10  # the unshared tails keep every prompt distinct
    assert len({r.prompt[10] for r in wl[:4]}) == 4
    # groups of 4, 4, 2: (3 + 3 + 1) of 10 requests find the shared half
    assert intended_hit_rate(10, 0.5, 4) == pytest.approx(0.5 * 7 / 10)
    assert intended_hit_rate(10, 0.0, 4) == 0.0
    for bad in ({"prefix_fraction": 1.5}, {"group_size": 0}):
        with pytest.raises(UserError):
            build_workload(4, PromptSpec(8, 2, **{"prefix_fraction": 0.5, "group_size": 2, **bad}))


def test_achieved_hit_rate_reads_cached_tokens():
    recs = [
        {"ok": True, "warmup": False, "input_tokens": 100, "cached_tokens": 50},
        {"ok": True, "warmup": False, "input_tokens": 100, "cached_tokens": 0},
        {"ok": True, "warmup": True, "input_tokens": 100, "cached_tokens": 100},
        {"ok": False, "warmup": False, "input_tokens": 100, "cached_tokens": 100},
    ]
    assert achieved_hit_rate(recs) == 0.25
    assert achieved_hit_rate([{"ok": True, "input_tokens": 5}]) is None


@pytest.mark.slow
def test_prefix_fraction_as_a_sweep_axis_hits_the_cache_as_intended(sim, tmp_path):
    """Shared prefixes of 8 tokens (one cache block) in groups of 4: the server's reported hits match the
    intended hit rate exactly; the row records the intended sharing."""
    cfg = LoadConfig(url=sim.url, model="sim", num_requests=8, warmup_requests=0, isl=16, osl=2)
    sim.log.clear()
    backend = ServedBackend(cfg, [2], tmp_path, prefix_fractions=[0.0, 0.5], group_size=4)
    df = run_grid(backend, tmp_path, progress=False).set_index("x_prefix_fraction")
    assert len(load_results(tmp_path)) == 2 and len(set(df["point_id"])) == 2
    assert df.loc[0.5, "x_prefix_hit_rate_intended"] == pytest.approx(0.5 * 6 / 8)
    served = [x for x in sim.log[8:]]  # the second point's requests
    assert sum(x["cached"] for x in served) / sum(x["tokens"] for x in served) == pytest.approx(0.5 * 6 / 8)
    assert sum(x["cached"] for x in sim.log[:8]) == 0
    fig = prefix_plot(df.reset_index())
    fig.savefig(tmp_path / "prefix.png")
    assert (tmp_path / "prefix.png").stat().st_size > 0
